"""Mixtral-style sparse MoE block: softmax router, top-k, renormalised weights, SwiGLU experts."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.spec import ModelSpec


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts, keep the top-k, renormalise: (weights [N, k], experts [N, k])."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), experts


class MoEBlock(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_experts, self.top_k = spec.num_experts, spec.experts_per_token
        d, f = spec.hidden_size, spec.intermediate_size
        self.gate = nn.Linear(d, spec.num_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(spec.num_experts, f, d))
        self.w3 = nn.Parameter(torch.empty(spec.num_experts, f, d))
        self.w2 = nn.Parameter(torch.empty(spec.num_experts, d, f))
        self.register_buffer("expert_tokens", torch.zeros(spec.num_experts, dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.top_k)
        flat_experts = experts.flatten()
        counts = torch.bincount(flat_experts, minlength=self.num_experts)
        self.expert_tokens += counts
        order = torch.argsort(flat_experts, stable=True)
        token_of = order // self.top_k
        weight_of = weights.flatten()[order].to(x.dtype)
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts.tolist()):
            if count == 0:
                continue
            rows = token_of[start:start + count]
            h = x[rows]
            y = F.linear(F.silu(F.linear(h, self.w1[expert])) * F.linear(h, self.w3[expert]), self.w2[expert])
            out.index_add_(0, rows, y * weight_of[start:start + count, None])
            start += count
        return out
