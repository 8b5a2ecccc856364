"""ForwardBatch: one packed, variable-length forward over many sequences of a paged KV cache."""
from __future__ import annotations

from dataclasses import dataclass

import torch

SHORT_QUERY = 16  # sequences with at most this many new tokens share one padded attention call


@dataclass
class AttentionGroup:
    """Sequences whose attention runs as one padded call: queries [B, Q], keys [B, C]."""
    query_rows: torch.Tensor   # [B, Q] packed row of each query (0 where padded)
    query_valid: torch.Tensor  # [B, Q] bool
    key_slots: torch.Tensor    # [B, C] cache slot of each key position (0 where padded)
    mask: torch.Tensor         # [B, 1, Q, C] bool, True = may attend


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
    q_lens = torch.tensor([len(chunks[i].tokens) for i in members])
    starts = torch.tensor([chunks[i].start for i in members])
    ctx_lens = starts + q_lens
    q_max, c_max = int(q_lens.max()), int(ctx_lens.max())
    q_idx = torch.arange(q_max)
    query_valid = q_idx[None, :] < q_lens[:, None]
    query_rows = torch.where(query_valid, torch.tensor([row_starts[i] for i in members])[:, None] + q_idx, 0)
    max_blocks = (c_max + block_size - 1) // block_size
    tables = torch.zeros(len(members), max_blocks, dtype=torch.long)
    for b, i in enumerate(members):
        table = chunks[i].block_table[:max_blocks]
        tables[b, :len(table)] = torch.tensor(table, dtype=torch.long)
    key_pos = torch.arange(c_max)
    key_slots = tables[:, key_pos // block_size] * block_size + key_pos % block_size
    query_pos = starts[:, None] + q_idx[None, :]
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    mask = mask & query_valid[:, :, None] | (~query_valid[:, :, None] & (key_pos == 0)[None, None, :])
    key_slots = torch.where(key_pos[None, :] < ctx_lens[:, None], key_slots, 0)
    return AttentionGroup(query_rows.to(device), query_valid.to(device), key_slots.to(device),
                          mask[:, None].to(device))
