"""Paged KV cache: a block allocator and per-model cache tensors addressed by slot."""
from __future__ import annotations

from collections import deque

import torch

from engine.model.model_spec import ModelSpec


class OutOfBlocks(RuntimeError):
    pass


class BlockAllocator:
    """Hands out fixed-size KV blocks by id; a block id addresses the same slots in every cache."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        """Whether grow(table, num_tokens) would succeed."""
        return self.blocks_for(num_tokens) - len(table) <= len(self._free)

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Extend a block table in place so that it holds num_tokens; raises OutOfBlocks, changing nothing (ask
        can_grow first)."""
        missing = self.blocks_for(num_tokens) - len(table)
        if missing <= 0:
            return
        if missing > len(self._free):
            raise OutOfBlocks(f"need {missing} blocks, {len(self._free)} free")
        table.extend(self._free.popleft() for _ in range(missing))

    def release(self, table: list[int]) -> None:
        self._free.extend(table)
        table.clear()


class KVCache:
    """K and V for every layer of one model, [layers, slots, kv_heads, head_dim]."""

    def __init__(self, spec: ModelSpec, num_slots: int, dtype: torch.dtype, device: torch.device):
        shape = (spec.num_layers, num_slots, spec.num_kv_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer][slots], self.v[layer][slots]
