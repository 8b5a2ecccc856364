"""Verification: the target's logits judge each sequence's drafts in one pass, by rejection sampling that keeps the
output exactly the target's (governor_kernels.verify_drafts), or by argmax where every sequence decodes greedily."""
from __future__ import annotations

import torch

from engine.runtime.sampling import probs_from_logits, uniforms
from engine.runtime.scheduler import Scheduled
from engine.speculative.drafters import Drafts
from governor_kernels import verify_drafts


def verify(sampling: list[Scheduled], drafts: Drafts | None, logits: torch.Tensor, device: torch.device) -> None:
    """Judge each sampling item's drafts against the target and set item.accepted and item.next_token.

    logits: [sum over items of (len(proposed) + 1), vocab], one row per position the items sample at, item
    after item: its proposed drafts' positions, then the bonus position after them. B = len(sampling)."""
    if not sampling:
        return
    if all(item.seq.params.greedy for item in sampling):
        verify_greedy(sampling, logits)
        return
    counts = [len(item.proposed) for item in sampling]
    k = max(counts, default=0)
    params = [item.seq.params for item in sampling]
    per_row = torch.tensor(counts, device=device) + 1                          # [B]
    temperature = torch.tensor([p.temperature for p in params], device=device).repeat_interleave(per_row)
    top_p = torch.tensor([p.top_p for p in params], device=device).repeat_interleave(per_row)
    probs = probs_from_logits(logits, temperature, top_p)                           # [sum(per_row), vocab]
    starts = torch.cumsum(per_row, 0) - per_row                                     # [B] first row per item
    offsets = torch.arange(k + 1, device=device)                               # [k + 1]
    rows = torch.where(offsets[None, :] < per_row[:, None], starts[:, None] + offsets[None, :], 0)  # [B, k + 1]
    draft_tokens = torch.zeros(len(sampling), k, dtype=torch.long, device=device)              # [B, k]
    draft_probs = None                                                              # [B, k, vocab] if sampled
    if drafts is not None and drafts.probs is not None:
        draft_probs = torch.zeros(len(sampling), k, probs.shape[-1], device=device)
    for i, item in enumerate(sampling):
        if counts[i]:
            draft_tokens[i, :counts[i]] = torch.tensor(item.proposed, device=device)
            if draft_probs is not None:
                draft_probs[i, :counts[i]] = drafts.probs[item.draft_row, :counts[i]]
    randoms = uniforms([item.seq.generator for item in sampling], [c + 1 for c in counts], device)  # [B, k+1]
    sample_u = randoms.gather(1, torch.tensor(counts, device=device)[:, None]).squeeze(1)          # [B]
    num_accepted, next_token = verify_drafts(draft_tokens, torch.tensor(counts, device=device), draft_probs,
                                             probs[rows], randoms[:, :k], sample_u)                     # [B], [B]
    for item, accepted, token in zip(sampling, num_accepted.tolist(), next_token.tolist()):
        item.accepted, item.next_token = accepted, token

def verify_greedy(sampling: list[Scheduled], logits: torch.Tensor) -> None:
    """verify_drafts for one-hot target rows: a draft is kept while it is the target's argmax, and the next
    token is the argmax after the last kept draft. logits: as in verify."""
    best = logits.argmax(dim=-1).tolist()                                           # [sum(len(proposed) + 1)]
    row = 0
    for item in sampling:
        proposed = item.proposed
        item.accepted = next((j for j, token in enumerate(proposed) if token != best[row + j]), len(proposed))
        item.next_token = best[row + item.accepted]
        row += len(proposed) + 1
