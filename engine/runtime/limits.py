"""EngineLimits: the sizes an engine is built with (KV cache, sequences and tokens per step)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLimits:
    kv_cache_tokens: int = 16384
    block_size: int = 16
    max_num_seqs: int = 32
    max_batch_tokens: int = 512

    @property
    def num_blocks(self) -> int:
        return -(-self.kv_cache_tokens // self.block_size)
