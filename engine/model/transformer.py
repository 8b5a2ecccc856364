"""A decoder-only transformer covering the Llama (dense) and Mixtral (MoE) architectures."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.batch import AttentionGroup, ForwardBatch
from engine.model.kv_cache import KVCache
from engine.model.model_spec import ModelSpec
from engine.model.moe_layer import MoEBlock

MoERunner = Callable[[MoEBlock, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        inv_freq = 1.0 / spec.rope_theta ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim)
        angles = torch.outer(torch.arange(spec.max_position, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
        """cos and sin [N, 1, head_dim] of the batch's positions, looked up once per forward for every layer."""
        return RotaryTables(self.cos[positions][:, None, :].to(dtype), self.sin[positions][:, None, :].to(dtype))


class RotaryTables(NamedTuple):
    cos: torch.Tensor
    sin: torch.Tensor

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_proj = nn.Linear(spec.hidden_size, spec.num_heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: KVCache, rotary: RotaryTables) -> torch.Tensor:
        n = x.shape[0]
        q = rotary.apply(self.q_proj(x).view(n, self.num_heads, self.head_dim))
        k = rotary.apply(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        cache.write(self.layer, batch.slot_mapping, k, v)
        if len(batch.groups) == 1 and batch.groups[0].packed:
            return self.o_proj(self._attend(q.view(*batch.groups[0].query_rows.shape, *q.shape[1:]),
                                            batch.groups[0], cache).reshape(n, -1))
        out = torch.empty_like(q)
        for group in batch.groups:
            out[group.valid_rows] = self._attend(q[group.query_rows], group, cache).flatten(0, 1)[group.valid_index]
        return self.o_proj(out.view(n, -1))

    def _attend(self, queries: torch.Tensor, group: AttentionGroup, cache: KVCache) -> torch.Tensor:
        """queries [B, Q, heads, head_dim] -> [B, Q, heads, head_dim]"""
        keys, values = cache.read(self.layer, group.key_slots)
        return F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=group.mask, enable_gqa=self.num_heads != self.num_kv_heads).transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MoEBlock(spec) if spec.is_moe else MLP(spec)

    def forward(self, x, batch: ForwardBatch, cache: KVCache, rotary: RotaryTables,
                experts: MoERunner | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, cache, rotary)
        h = self.post_attention_layernorm(x)
        return x + (experts(self.mlp, h) if experts is not None and isinstance(self.mlp, MoEBlock) else self.mlp(h))


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = Rotary(spec)

    @property
    def moe_blocks(self) -> list[MoEBlock]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoEBlock)]

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache, experts: MoERunner | None = None) -> torch.Tensor:
        """Logits [len(batch.logits_rows), vocab] in float32; experts runs the MoE layers (default: the block's own)."""
        x = self.embed_tokens(batch.input_ids)
        rotary = self.rotary.tables(batch.positions, x.dtype)
        for layer in self.layers:
            x = layer(x, batch, cache, rotary, experts)
        return self.lm_head(self.norm(x[batch.logits_rows])).float()

    def truncated(self, num_layers: int) -> Transformer:
        """A view of the first num_layers layers, sharing weights: a self-speculative drafter."""
        view = Transformer.__new__(Transformer)
        nn.Module.__init__(view)
        view.spec = self.spec.with_layers(num_layers)
        view.embed_tokens, view.norm, view.lm_head, view.rotary = self.embed_tokens, self.norm, self.lm_head, self.rotary
        view.layers = nn.ModuleList(self.layers[:num_layers])
        return view
