"""MoE routing: softmax, top-k, renormalise, per-expert counts and each choice's slot within its expert.

Ties: among equal probabilities the lowest expert index ranks first (torch.topk on the CPU does not promise
this, so the reference ranks with a stable sort).

Drop policy (capacity > 0): an expert takes at most `capacity` (token, choice) pairs. First choices outrank
second choices (a token's top-1 expert is served before any token's top-2), and within one choice rank
earlier tokens in the batch come first. A pair whose slot is >= capacity is dropped; the token keeps its
other experts, and a token that loses all of them passes through the block unchanged (residual only).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Routing(NamedTuple):
    weights: torch.Tensor   # [N, k] float32, renormalised over the k chosen experts
    experts: torch.Tensor   # [N, k] long
    counts: torch.Tensor    # [E] long, pairs routed to each expert before any drop
    slots: torch.Tensor     # [N, k] long, the pair's position in its expert's queue (priority order above)


def route_tokens(router_logits: torch.Tensor, top_k: int) -> Routing:
    """router_logits [N, E] (any float dtype); softmax is taken in float32."""
    num_experts = router_logits.shape[-1]
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = (part[..., :top_k] for part in torch.sort(probs, dim=-1, descending=True, stable=True))
    weights = weights / weights.sum(dim=-1, keepdim=True)
    by_priority = experts.t().reshape(-1)                                  # choice-major: all top-1s, then top-2s
    one_hot = torch.nn.functional.one_hot(by_priority, num_experts)
    slots = ((one_hot.cumsum(dim=0) - 1) * one_hot).sum(dim=-1)
    counts = one_hot.sum(dim=0)
    return Routing(weights, experts, counts, slots.reshape(top_k, -1).t().contiguous())


def expert_capacity(capacity_factor: float, num_tokens: int, top_k: int, num_experts: int) -> int | None:
    """ceil(capacity_factor * tokens * k / experts); None when dropless (capacity_factor == 0)."""
    if capacity_factor == 0:
        return None
    return math.ceil(round(capacity_factor * num_tokens * top_k / num_experts, 9))
