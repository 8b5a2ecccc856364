"""Continuous batching: each step mixes decoding sequences and prefill chunks under a token budget."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.model.kv_cache import BlockAllocator
from engine.runtime.sequence import Sequence


@dataclass
class Scheduled:
    """One sequence's share of a step; the engine fills in the step's scratch (drafts, verdict) as it goes."""
    seq: Sequence
    num_new: int      # tokens fed from seq.tokens, starting at seq.num_computed
    draft_len: int    # drafts to verify after them (decode only)
    prefill: bool = False
    proposed: list[int] = field(default_factory=list)   # draft tokens the drafter proposed (<= draft_len)
    draft_row: int | None = None                          # this item's row in the step's Drafts, if it drafted
    accepted: int = 0                                     # proposed tokens the target kept
    next_token: int | None = None                         # the token sampled after the kept drafts

    @property
    def samples(self) -> bool:
        return self.seq.num_computed + self.num_new == len(self.seq.tokens)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, max_num_seqs: int, max_batch_tokens: int, max_model_len: int):
        self.allocator = allocator
        self.max_num_seqs, self.max_batch_tokens, self.max_model_len = max_num_seqs, max_batch_tokens, max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def next_batch_size(self) -> int:
        """Sequences the next step will hold (running ones and those it may admit): what k follows."""
        return min(len(self.running) + len(self.waiting), max(self.max_num_seqs, len(self.running)))

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or cancelled sequence out and return its blocks to the pool."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.release(seq.block_table)

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in [*self.running, *self.waiting] if s.request_id == request_id), None)

    def schedule(self, draft_len: int) -> list[Scheduled]:
        budget = self.max_batch_tokens
        plan: list[Scheduled] = []
        for seq in [s for s in self.running if not s.in_prefill]:
            if seq not in self.running or budget < 1:
                continue
            k = min(draft_len, budget - 1, seq.params.max_tokens - seq.num_output - 1,
                    self.max_model_len - len(seq.tokens))
            k = max(k, 0)
            if self._grow_or_preempt(seq, len(seq.tokens) + k, plan):
                plan.append(Scheduled(seq, 1, k))
                budget -= 1 + k
        for seq in [s for s in self.running if s.in_prefill]:
            if seq in self.running:
                budget = self._plan_prefill(seq, budget, plan, may_preempt=True)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._plan_prefill(seq, budget, plan, may_preempt=False) == budget:
                break
            self.running.append(self.waiting.popleft())
            budget = self.max_batch_tokens - sum(s.num_new + s.draft_len for s in plan)
        return plan

    def _plan_prefill(self, seq: Sequence, budget: int, plan: list[Scheduled], may_preempt: bool) -> int:
        chunk = min(len(seq.tokens) - seq.num_computed, budget)
        if chunk <= 0:
            return budget
        num_tokens = seq.num_computed + chunk
        if may_preempt:
            if not self._grow_or_preempt(seq, num_tokens, plan):
                return budget
        elif self.allocator.can_grow(seq.block_table, num_tokens):
            self.allocator.grow(seq.block_table, num_tokens)
        else:
            return budget
        plan.append(Scheduled(seq, chunk, 0, prefill=True))
        return budget - chunk

    def _grow_or_preempt(self, seq: Sequence, num_tokens: int, plan: list[Scheduled]) -> bool:
        """Make room for seq by preempting the latest-arrived unplanned sequences; False if seq itself went."""
        planned = {p.seq for p in plan}
        while not self.allocator.can_grow(seq.block_table, num_tokens):
            victim = max((s for s in self.running if s not in planned), key=lambda s: s.arrival)
            self.running.remove(victim)
            self.allocator.release(victim.block_table)
            victim.preempt()
            self.waiting.appendleft(victim)
            self.preemptions += 1
            if victim is seq:
                return False
        self.allocator.grow(seq.block_table, num_tokens)
        return True
