"""ForwardBatch: one packed, variable-length forward over many sequences of a paged KV cache."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

SHORT_QUERY = 16  # sequences with at most this many new tokens share one padded attention call


@dataclass
class AttentionGroup:
    """Sequences whose attention runs as one padded call: queries [B, Q], keys [B, C]."""
    query_rows: torch.Tensor   # [B, Q] packed row of each query (0 where padded)
    valid_rows: torch.Tensor   # [V] packed rows of the real queries, in [B, Q] order
    valid_index: torch.Tensor  # [V] their flat index into [B * Q]
    key_slots: torch.Tensor    # [B, C] cache slot of each key position (0 where padded)
    mask: torch.Tensor         # [B, 1, Q, C] bool, True = may attend
    packed: bool               # no padding and rows in order: the queries are exactly packed rows 0 .. B*Q-1


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor     # [N]
    positions: torch.Tensor     # [N]
    slot_mapping: torch.Tensor  # [N] cache slot each new token's K/V is written to
    groups: list[AttentionGroup]
    logits_rows: torch.Tensor   # [M] packed rows whose logits are wanted

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


@dataclass
class SequenceChunk:
    """New tokens of one sequence: they sit at positions start .. start+len(tokens)-1."""
    tokens: list[int]
    start: int
    block_table: list[int]
    logits_from: int  # index into tokens from which logits are wanted (len(tokens) = none)


def build_forward_batch(chunks: list[SequenceChunk], block_size: int, device: torch.device) -> ForwardBatch:
    tokens, positions, slots, logits_rows = [], [], [], []
    row = 0
    for chunk in chunks:
        n = len(chunk.tokens)
        pos = range(chunk.start, chunk.start + n)
        tokens.extend(chunk.tokens)
        positions.extend(pos)
        slots.extend(chunk.block_table[p // block_size] * block_size + p % block_size for p in pos)
        logits_rows.extend(range(row + chunk.logits_from, row + n))
        row += n
    short = [i for i, c in enumerate(chunks) if len(c.tokens) <= SHORT_QUERY]
    long_ = [[i] for i, c in enumerate(chunks) if len(c.tokens) > SHORT_QUERY]
    row_starts = _row_starts(chunks)
    groups = [_attention_group(chunks, members, row_starts, block_size, device)
              for members in ([short] if short else []) + long_]
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return ForwardBatch(as_long(tokens), as_long(positions), as_long(slots), groups, as_long(logits_rows))


def _row_starts(chunks: list[SequenceChunk]) -> list[int]:
    starts, row = [], 0
    for chunk in chunks:
        starts.append(row)
        row += len(chunk.tokens)
    return starts


def _attention_group(chunks, members, row_starts, block_size, device) -> AttentionGroup:
    """Built with numpy: at decode sizes its small ops cost a fraction of torch's dispatch."""
    q_lens = [len(chunks[i].tokens) for i in members]
    q_max = max(q_lens)
    c_max = max(chunks[i].start + n for i, n in zip(members, q_lens))
    max_blocks = (c_max + block_size - 1) // block_size
    tables = np.array([_padded(chunks[i].block_table[:max_blocks], max_blocks) for i in members], dtype=np.int64)
    q_lens_a, starts, first_rows = np.array([q_lens, [chunks[i].start for i in members],
                                             [row_starts[i] for i in members]], dtype=np.int64)
    ctx_lens = starts + q_lens_a
    q_idx = np.arange(q_max)
    query_valid = q_idx[None, :] < q_lens_a[:, None]
    query_rows = np.where(query_valid, first_rows[:, None] + q_idx, 0)
    key_pos = np.arange(c_max)
    key_slots = tables[:, key_pos // block_size] * block_size + key_pos % block_size
    query_pos = starts[:, None] + q_idx[None, :]
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    mask = mask & query_valid[:, :, None] | (~query_valid[:, :, None] & (key_pos == 0)[None, None, :])
    key_slots = np.where(key_pos[None, :] < ctx_lens[:, None], key_slots, 0)
    packed = all(n == q_max for n in q_lens) and [row_starts[i] for i in members] == list(
        range(0, q_max * len(members), q_max))
    valid_index = np.flatnonzero(query_valid)
    as_tensor = lambda array: torch.from_numpy(array).to(device)  # noqa: E731
    return AttentionGroup(as_tensor(query_rows), as_tensor(query_rows.reshape(-1)[valid_index]),
                          as_tensor(valid_index), as_tensor(key_slots), as_tensor(mask[:, None]), packed)


def _padded(values: list[int], length: int) -> list[int]:
    return values + [0] * (length - len(values))
