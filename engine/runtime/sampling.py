"""Turn logits into the distributions requests sample from (temperature, top-p, greedy as one-hot)."""
from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [R, V]; temperature, top_p [R]. A temperature of 0 gives a one-hot argmax row."""
    greedy = temperature <= 0
    probs = torch.softmax(logits / torch.where(greedy, 1.0, temperature)[:, None], dim=-1)
    probs = _top_p(probs, top_p)
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    if bool((top_p >= 1.0).all()):
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = torch.where(mass_before < top_p[:, None], sorted_probs, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def uniforms(generators: list[torch.Generator | None], counts: list[int], device: torch.device) -> torch.Tensor:
    """[rows, max(counts)] uniforms in [0, 1), zero-padded. Row i draws exactly counts[i] numbers from its
    request's own generator (None = greedy: zeros), so a seeded request samples alike in any batch."""
    out = torch.zeros(len(generators), max(counts, default=0))
    for row, (generator, count) in enumerate(zip(generators, counts)):
        if generator is not None:
            out[row, :count] = torch.rand(count, generator=generator)
    return out.to(device)
