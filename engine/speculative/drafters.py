"""Drafters propose up to k tokens per sequence; the target verifies them. One interface, two kinds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from engine.model.batch import SequenceChunk, build_forward_batch
from engine.model.kv_cache import KVCache
from engine.model.transformer import Transformer
from engine.runtime.sampling import probs_from_logits, uniforms
from engine.runtime.sequence import Sequence
from governor_kernels import sample_categorical


@dataclass
class Drafts:
    tokens: torch.Tensor          # [B, K] long, padded past num_drafts
    num_drafts: torch.Tensor      # [B] long
    probs: torch.Tensor | None    # [B, K, V] distributions the tokens were sampled from; None = deterministic


class Drafter(Protocol):
    def propose(self, seqs: list[Sequence], lengths: list[int]) -> Drafts:
        """Propose up to lengths[i] tokens to follow seqs[i].tokens."""

    def accepted(self, seq: Sequence, drafted_from: int, num_accepted: int) -> None:
        """Verification kept num_accepted drafts of those proposed after drafted_from tokens."""


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the sequence's suffix and copy what followed."""

    def __init__(self, min_n: int, max_n: int, device: torch.device):
        self.min_n, self.max_n, self.device = min_n, max_n, device

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> Drafts:
        k = max(lengths, default=0)
        tokens = torch.zeros(len(seqs), k, dtype=torch.long)
        num = torch.zeros(len(seqs), dtype=torch.long)
        for i, (seq, length) in enumerate(zip(seqs, lengths)):
            found = prompt_lookup(np.asarray(seq.tokens), length, self.min_n, self.max_n)
            tokens[i, :len(found)] = torch.as_tensor(found, dtype=torch.long)
            num[i] = len(found)
        return Drafts(tokens.to(self.device), num.to(self.device), None)

    def accepted(self, seq: Sequence, drafted_from: int, num_accepted: int) -> None:
        pass


def prompt_lookup(history: np.ndarray, length: int, min_n: int, max_n: int) -> np.ndarray:
    """Up to length tokens that followed the latest earlier occurrence of history's longest suffix of min_n..max_n
    tokens; none if no suffix recurs."""
    for n in range(min(max_n, len(history) - 1), min_n - 1, -1):
        windows = sliding_window_view(history[:-1], n)
        hits = np.flatnonzero((windows == history[-n:]).all(axis=1))
        if len(hits):
            start = hits[-1] + n
            return history[start:start + length]
    return history[:0]


def shadow_lookups(seq: Sequence, length: int, min_n: int, max_n: int) -> list[tuple[int, int]]:
    """Prompt lookup run in the shadow of the decoding in use, as speculation at k = length would have run over the
    tokens generated: draft length tokens, count those the generated tokens match up to the first that does not, and
    draft next after them and the token that followed (as verification's bonus token). Returns (drafted, accepted) for
    each shadow draft that length generated tokens now follow; the next call goes on from there, however many tokens
    a step added (where seq.shadow_at is 0, the shadow starts afresh length tokens back: starting there after every
    step of speculation that added 3 or more tokens, it broke the drafts' tiling of the text). A deterministic draft
    token is accepted with the sampling distribution's probability of it, the probability with which plain decoding
    generates it, and a rejected draft's replacement is drawn as plain decoding draws that token: the shadow measures
    the acceptance prompt lookup would have had, at the cost of a lookup and no verification."""
    at = seq.shadow_at or max(len(seq.prompt_ids) + 1, len(seq.tokens) - length - 1)
    if at + length > len(seq.tokens):
        return []
    history = np.asarray(seq.tokens)
    out = []
    while at + length <= len(history):
        found = prompt_lookup(history[:at], length, min_n, max_n)
        mismatches = np.flatnonzero(found != history[at:at + len(found)])
        accepted = int(mismatches[0]) if len(mismatches) else len(found)
        out.append((len(found), accepted))
        at += accepted + 1
    seq.shadow_at = at
    return out


class ModelDrafter:
    """A small causal LM (or the target's own first layers) drafting autoregressively on its own KV cache."""

    def __init__(self, model: Transformer, cache: KVCache, block_size: int):
        self.model, self.cache, self.block_size = model, cache, block_size
        self.device = next(model.parameters()).device

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> Drafts:
        """Greedy requests draft the argmax (the one-hot distribution's only token), so when all are greedy no
        distributions are kept (Drafts.probs None: deterministic drafts, which verify alike)."""
        k, batch = max(lengths, default=0), len(seqs)
        greedy = all(s.params.greedy for s in seqs)
        proposed: list[list[int]] = [[] for _ in seqs]
        probs = None if greedy else torch.zeros(batch, k, self.model.spec.vocab_size, device=self.device)
        temperature = torch.tensor([s.params.temperature for s in seqs], device=self.device)
        top_p = torch.tensor([s.params.top_p for s in seqs], device=self.device)
        chunks = [SequenceChunk(s.tokens[s.draft_computed:], s.draft_computed, s.block_table,
                                len(s.tokens) - 1 - s.draft_computed) for s in seqs]
        active = list(range(batch))
        for step in range(k):
            active = [i for i in active if lengths[i] > step]
            if not active:
                break
            logits = self.model(build_forward_batch([chunks[i] for i in active], self.block_size, self.device), self.cache)
            if greedy:
                drawn = logits.argmax(dim=-1)
            else:
                rows = torch.tensor(active, device=self.device)
                dist = probs_from_logits(logits, temperature[rows], top_p[rows])
                draws = uniforms([seqs[i].generator for i in active], [1] * len(active), self.device)[:, 0]
                drawn = sample_categorical(dist, draws)
                probs[rows, step] = dist
            for i, token in zip(active, drawn.tolist()):
                proposed[i].append(token)
                position = len(seqs[i].tokens) + step
                chunks[i] = SequenceChunk([token], position, seqs[i].block_table, 0)
                seqs[i].draft_computed = position
        tokens = torch.tensor([p + [0] * (k - len(p)) for p in proposed], dtype=torch.long, device=self.device)
        return Drafts(tokens.view(batch, k), torch.tensor(lengths, device=self.device), probs)

    def accepted(self, seq: Sequence, drafted_from: int, num_accepted: int) -> None:
        seq.draft_computed = min(seq.draft_computed, drafted_from + num_accepted)
