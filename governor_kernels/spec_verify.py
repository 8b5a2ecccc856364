"""Speculative verification: lossless rejection sampling of k drafted tokens against the target.

Accept draft token x at position j with probability min(1, p_j(x) / q_j(x)); at the first rejection
sample the recovered token from normalize(max(0, p_j - q_j)); when all drafts are accepted, sample a
bonus token from p at the next position. Greedy decoding is the case where p and q are one-hot.
"""
from __future__ import annotations

import torch

from governor_kernels.categorical import sample_categorical


def verify_drafts(
    draft_tokens: torch.Tensor,         # [B, K] long, padded past num_drafts
    num_drafts: torch.Tensor,           # [B] long, 0..K
    draft_probs: torch.Tensor | None,   # [B, K, V] the draft's distributions; None = deterministic drafts
    target_probs: torch.Tensor,         # [B, K+1, V]
    accept_uniforms: torch.Tensor,      # [B, K] in [0, 1)
    sample_uniforms: torch.Tensor,      # [B] in [0, 1)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (num_accepted [B], next_token [B]): emit draft_tokens[b, :num_accepted[b]] then next_token[b]."""
    batch, k = draft_tokens.shape
    rows = torch.arange(batch, device=draft_tokens.device)
    p_draft = target_probs[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)
    q_draft = (torch.ones_like(p_draft) if draft_probs is None
               else draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1))
    drafted = torch.arange(k, device=draft_tokens.device)[None, :] < num_drafts[:, None]
    accepted = (accept_uniforms * q_draft < p_draft) & drafted
    num_accepted = accepted.int().cumprod(dim=-1).sum(dim=-1).long()

    p_next = target_probs[rows, num_accepted]
    rejected = num_accepted < num_drafts
    position = num_accepted.clamp(max=max(k - 1, 0))
    if draft_probs is None:
        q_next = torch.zeros_like(p_next)
        if k:
            q_next[rows, draft_tokens[rows, position]] = 1.0
    else:
        q_next = draft_probs[rows, position] if k else torch.zeros_like(p_next)
    residual = torch.where(rejected[:, None], (p_next - q_next).clamp(min=0.0), p_next)
    degenerate = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(degenerate, p_next, residual)
    return num_accepted, sample_categorical(residual, sample_uniforms)
