"""Speculative verification as one Triton program per sequence; same signature and results as spec_verify.py.

The program finds the accepted prefix from the k drafted tokens, then walks the vocabulary in blocks twice: once
for the residual's total (and whether it is all zero), once to find the sampled index by inverse CDF. Prefix sums
accumulate in float64 and round to float32, as torch's CPU cumsum of float32 does, so the same uniforms pick the
same token. Probabilities are read as float32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024


@triton.jit
def _p_q_block(p_row, q_row, start, V, q_limit, draft_token,
               HAS_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    """One block of the vocabulary from start: its indices, the target's p and the draft's q there (one-hot at the
    draft token for deterministic drafts; zero where q does not matter, q_limit 0)."""
    v = start + tl.arange(0, BLOCK_V)
    p_next = tl.load(p_row + v, mask=v < V, other=0.0)
    if HAS_DRAFT_PROBS:
        q_next = tl.load(q_row + v, mask=v < q_limit, other=0.0)
    else:
        q_next = tl.where(v == draft_token, 1.0, 0.0)
    return v, p_next, q_next


@triton.jit
def _verify_kernel(draft_tokens, num_drafts, draft_probs, target_probs, accept_uniforms, sample_uniforms,
                   num_accepted_out, next_token_out, K, V,
                   HAS_DRAFT_PROBS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_K)
    drafted = tl.load(num_drafts + row)
    in_k = j < K
    tokens = tl.load(draft_tokens + row * K + j, mask=in_k, other=0)
    p = tl.load(target_probs + (row * (K + 1) + j) * V + tokens, mask=in_k, other=0.0)
    if HAS_DRAFT_PROBS:
        q = tl.load(draft_probs + (row * K + j) * V + tokens, mask=in_k, other=1.0)
    else:
        q = tl.full((BLOCK_K,), 1.0, tl.float32)
    u = tl.load(accept_uniforms + row * K + j, mask=in_k, other=1.0)
    accepted = (u * q < p) & (j < drafted)
    accepted_count = tl.min(tl.where(accepted, K, j), axis=0)     # first rejection, or K when all accepted
    rejected = accepted_count < drafted
    position = tl.minimum(accepted_count, tl.maximum(K - 1, 0))
    p_row = target_probs + (row * (K + 1) + accepted_count) * V
    q_row = draft_probs + (row * K + position) * V
    q_limit = tl.where(rejected, V, 0)              # q matters only after a rejection
    draft_token = tl.where(rejected, tl.sum(tl.where(j == position, tokens, 0), axis=0), -1)

    residual_total = tl.zeros((), tl.float64)
    p_total = tl.zeros((), tl.float64)
    residual_peak = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK_V):
        v, p_next, q_next = _p_q_block(p_row, q_row, start, V, q_limit, draft_token, HAS_DRAFT_PROBS, BLOCK_V)
        residual = tl.where(rejected, tl.maximum(p_next - q_next, 0.0), p_next)
        residual_total += tl.sum(residual.to(tl.float64), axis=0)
        p_total += tl.sum(p_next.to(tl.float64), axis=0)
        residual_peak = tl.maximum(residual_peak, tl.max(residual, axis=0))
    degenerate = residual_peak <= 0
    total = tl.where(degenerate, p_total, residual_total).to(tl.float32)
    target = tl.load(sample_uniforms + row) * total

    below = tl.zeros((), tl.int64)
    carry = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK_V):
        v, p_next, q_next = _p_q_block(p_row, q_row, start, V, q_limit, draft_token, HAS_DRAFT_PROBS, BLOCK_V)
        weight = tl.where(rejected & ~degenerate, tl.maximum(p_next - q_next, 0.0), p_next)
        cdf = carry + tl.cumsum(weight.to(tl.float64), axis=0)
        below += tl.sum(((cdf.to(tl.float32) <= target) & (v < V)).to(tl.int64), axis=0)
        carry += tl.sum(weight.to(tl.float64), axis=0)
    tl.store(num_accepted_out + row, accepted_count.to(tl.int64))
    tl.store(next_token_out + row, tl.minimum(below, V - 1))


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
    vocab = target_probs.shape[-1]
    device = draft_tokens.device
    num_accepted = torch.empty(batch, dtype=torch.long, device=device)
    next_token = torch.empty(batch, dtype=torch.long, device=device)
    if batch == 0:
        return num_accepted, next_token
    target = target_probs.float().contiguous()
    _verify_kernel[(batch,)](
        draft_tokens.long().contiguous(), num_drafts.long().contiguous(),
        target if draft_probs is None else draft_probs.float().contiguous(), target,
        accept_uniforms.float().contiguous(), sample_uniforms.float().contiguous(), num_accepted, next_token,
        k, vocab, HAS_DRAFT_PROBS=draft_probs is not None, BLOCK_K=triton.next_power_of_2(max(k, 1)),
        BLOCK_V=min(BLOCK_V, triton.next_power_of_2(vocab)))
    return num_accepted, next_token
