"""MoE routing in Triton; same signature and results as router.py (ties: the lowest expert index first).

One program per block of tokens does the softmax, the top-k (k rounds of argmax), the renormalisation, and for
every choice rank each token's pair within the block and count the block's pairs per expert. A pair's slot is
its rank in the block plus the pairs routed to its expert before the block in priority order (all first
choices of all blocks, then all second choices, ...): one exclusive prefix sum over the [k x blocks, E] counts.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from governor_kernels.router import Routing

BLOCK_TOKENS = 32


@triton.jit
def _route_kernel(logits, weights_out, experts_out, ranks_out, block_counts_out, N, E, stride,
                  TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    block = tl.program_id(0)
    num_blocks = tl.num_programs(0)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_E)
    in_rows, in_cols = rows < N, cols < E
    x = tl.load(logits + rows[:, None].to(tl.int64) * stride + cols[None, :],
                mask=in_rows[:, None] & in_cols[None, :], other=0.0).to(tl.float32)
    x = tl.where(in_cols[None, :], x, float("-inf"))
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    probs = e / tl.sum(e, axis=1)[:, None]
    remaining = tl.where(in_cols[None, :], probs, -1.0)
    choices = tl.arange(0, BLOCK_K)
    top_weights = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    top_experts = tl.zeros((BLOCK_N, BLOCK_K), tl.int32)
    for choice in tl.static_range(TOP_K):
        value = tl.max(remaining, axis=1)
        expert = tl.argmax(remaining, axis=1, tie_break_left=True)
        top_weights = tl.where(choices[None, :] == choice, value[:, None], top_weights)
        top_experts = tl.where(choices[None, :] == choice, expert[:, None], top_experts)
        chosen = cols[None, :] == expert[:, None]
        remaining = tl.where(chosen, -1.0, remaining)
        pairs = tl.where(chosen & in_rows[:, None], 1, 0)
        rank = tl.sum((tl.cumsum(pairs, axis=0) - 1) * pairs, axis=1)
        tl.store(ranks_out + rows.to(tl.int64) * TOP_K + choice, rank.to(tl.int64), mask=in_rows)
        tl.store(block_counts_out + (choice * num_blocks + block) * E + cols, tl.sum(pairs, axis=0).to(tl.int64),
                 mask=in_cols)
    out = rows[:, None].to(tl.int64) * TOP_K + choices[None, :]
    in_out = in_rows[:, None] & (choices[None, :] < TOP_K)
    tl.store(weights_out + out, top_weights / tl.sum(top_weights, axis=1)[:, None], mask=in_out)
    tl.store(experts_out + out, top_experts.to(tl.int64), mask=in_out)


def route_tokens(router_logits: torch.Tensor, top_k: int) -> Routing:
    """router_logits [N, E] (any float dtype); softmax is taken in float32."""
    num_tokens, num_experts = router_logits.shape
    device = router_logits.device
    num_blocks = triton.cdiv(num_tokens, BLOCK_TOKENS)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=device)
    experts = torch.empty(num_tokens, top_k, dtype=torch.long, device=device)
    ranks = torch.empty(num_tokens, top_k, dtype=torch.long, device=device)
    block_counts = torch.zeros(top_k, num_blocks, num_experts, dtype=torch.long, device=device)
    if num_tokens:
        logits = router_logits.contiguous()
        _route_kernel[(num_blocks,)](logits, weights, experts, ranks, block_counts, num_tokens, num_experts,
                                     logits.stride(0), TOP_K=top_k, BLOCK_K=triton.next_power_of_2(top_k),
                                     BLOCK_N=BLOCK_TOKENS,
                                     BLOCK_E=triton.next_power_of_2(num_experts))
    flat = block_counts.reshape(-1, num_experts)
    before = (flat.cumsum(dim=0) - flat).reshape(top_k, num_blocks, num_experts)
    block_of = torch.arange(num_tokens, device=device) // BLOCK_TOKENS
    slots = ranks + before[torch.arange(top_k, device=device)[None, :], block_of[:, None], experts]
    return Routing(weights, experts, flat.sum(dim=0), slots)
