"""Accumulates the engine's own measurements and closes them into Windows."""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from seam import Block, EngineConfig, LatencySummary, Window, batch_band, decode_cost_terms, median_batch_size
from seam.placement import balancedness

MAX_SAMPLES = 50_000  # per window and distribution; an unread window keeps the latest ones
READERS = ("default", "controller")     # windows kept from the start; other readers' from their first read
MAX_READERS = 8                         # beyond this, the reader read longest ago is forgotten


def _samples() -> deque:
    return deque(maxlen=MAX_SAMPLES)


@dataclass
class _Accumulator:
    start: float = field(default_factory=time.time)
    steps: int = 0
    num_drafts: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    shadow_lookups: int = 0
    shadow_drafted_per_position: list[int] = field(default_factory=list)
    shadow_accepted_per_position: list[int] = field(default_factory=list)
    emitted_tokens: int = 0
    prefill_tokens: int = 0
    finished_requests: int = 0
    target_forward_seconds: float = 0.0
    draft_forward_seconds: float = 0.0
    step_seconds: float = 0.0
    ttft: deque = field(default_factory=_samples)
    inter_token: deque = field(default_factory=_samples)
    e2e: deque = field(default_factory=_samples)
    batch_sizes: deque = field(default_factory=_samples)
    queue_depths: deque = field(default_factory=_samples)
    expert_tokens: torch.Tensor | None = None
    slot_tokens: torch.Tensor | None = None
    rank_tokens: torch.Tensor | None = None
    dropped_per_layer: torch.Tensor | None = None
    all_to_all_seconds: float = 0.0
    replacement_seconds: float = 0.0
    decode_cost_sums: list[float] = field(default_factory=list)
    by_band: dict[int, _Accumulator] | None = field(default_factory=dict)    # None in a band's own accumulator

    def add_step(self, step: StepRecord) -> None:
        if self.by_band is not None:
            band = batch_band(step.batch_size)
            if band not in self.by_band:
                self.by_band[band] = _Accumulator(start=self.start, by_band=None)
            self.by_band[band].add_step(step)
        self.steps += 1
        self.batch_sizes.append(step.batch_size)
        self.queue_depths.append(step.queue_depth)
        self.step_seconds += step.step_seconds
        self.target_forward_seconds += step.target_seconds
        self.draft_forward_seconds += step.draft_seconds
        self.num_drafts += step.num_drafts
        self.prefill_tokens += step.prefill_tokens
        if not step.prefill_tokens:
            _add_per_position(self.decode_cost_sums, decode_cost_terms(
                step.batch_size, sum(step.drafted_per_position), step.step_seconds - step.draft_seconds,
                step.draft_seconds))
        _add_per_position(self.drafted_per_position, step.drafted_per_position)
        _add_per_position(self.accepted_per_position, step.accepted_per_position)
        if step.shadow_lookups:
            self.shadow_lookups += step.shadow_lookups
            _add_per_position(self.shadow_drafted_per_position, step.shadow_drafted_per_position)
            _add_per_position(self.shadow_accepted_per_position, step.shadow_accepted_per_position)
        self.all_to_all_seconds += step.all_to_all_seconds
        self.expert_tokens = _add(self.expert_tokens, step.expert_tokens)
        self.slot_tokens = _add(self.slot_tokens, step.slot_tokens)
        self.rank_tokens = _add(self.rank_tokens, step.rank_tokens)
        self.dropped_per_layer = _add(self.dropped_per_layer, step.dropped_per_layer)

    def add_tokens(self, count: int, ttft: float | None, gap: float | None) -> None:
        self.emitted_tokens += count
        add_latencies(self, count, ttft, gap)

    def add_finished(self, e2e: float) -> None:
        self.finished_requests += 1
        self.e2e.append(e2e)

    def window(self, config: EngineConfig, **extra) -> Window:
        sizes, depths = self.batch_sizes or [0], self.queue_depths or [0]
        batch_size_mean = sum(sizes) / len(sizes)
        steps_per_batch_size = np.bincount(np.asarray(sizes, dtype=np.int64)).tolist()
        return Window(
            start=self.start, end=time.time(), config_version=config.version, spec_method=config.spec_method,
            draft_len=config.draft_len_for(median_batch_size(steps_per_batch_size, batch_size_mean)), steps=self.steps,
            num_drafts=self.num_drafts,
            drafted_tokens=sum(self.drafted_per_position), accepted_tokens=sum(self.accepted_per_position),
            drafted_per_position=list(self.drafted_per_position),
            accepted_per_position=list(self.accepted_per_position),
            shadow_lookups=self.shadow_lookups,
            shadow_drafted_per_position=list(self.shadow_drafted_per_position) if self.shadow_lookups else None,
            shadow_accepted_per_position=list(self.shadow_accepted_per_position) if self.shadow_lookups else None,
            emitted_tokens=self.emitted_tokens, prefill_tokens=self.prefill_tokens,
            finished_requests=self.finished_requests, target_forward_seconds=self.target_forward_seconds,
            draft_forward_seconds=self.draft_forward_seconds, step_seconds=self.step_seconds,
            ttft_seconds=LatencySummary.of(list(self.ttft)),
            inter_token_seconds=LatencySummary.of(list(self.inter_token)),
            e2e_seconds=LatencySummary.of(list(self.e2e)), batch_size_mean=batch_size_mean,
            batch_size_max=max(sizes), queue_depth_mean=sum(depths) / len(depths), queue_depth_max=max(depths),
            expert_tokens=_listed(self.expert_tokens), slot_tokens=_listed(self.slot_tokens),
            rank_tokens=_listed(self.rank_tokens),
            dropped_tokens=0 if self.dropped_per_layer is None else int(self.dropped_per_layer.sum()),
            dropped_per_layer=_listed(self.dropped_per_layer),
            **_balancedness_of(self.rank_tokens),
            all_to_all_seconds=self.all_to_all_seconds, capacity_factor=config.capacity_factor,
            replacement_seconds=self.replacement_seconds, steps_per_batch_size=steps_per_batch_size,
            decode_cost_sums=list(self.decode_cost_sums) or None,
            by_band={band: acc.window(config) for band, acc in sorted(self.by_band.items())} if self.by_band else None,
            **extra)


@dataclass
class _BlockAccumulator:
    """One switchback block in progress."""
    index: int
    arm: str
    config_version: int
    steps: int = 0
    emitted_tokens: int = 0
    busy_seconds: float = 0.0
    gap_seconds: float = 0.0
    gap_tokens: int = 0
    step_tokens: int = 0             # delivered by the step in progress (its record_step comes after them)
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    decode_sequences: int = 0
    sequences: int = 0

    def add_step(self, step: StepRecord) -> None:
        self.steps += 1
        self.sequences += step.batch_size
        self.busy_seconds += step.step_seconds
        if not step.prefill_tokens:
            self.decode_tokens += self.step_tokens
            self.decode_seconds += step.step_seconds
            self.decode_steps += 1
            self.decode_sequences += step.batch_size
        self.step_tokens = 0

    def closed(self) -> Block:
        return Block(self.index, self.arm, self.config_version, self.steps, self.emitted_tokens, self.busy_seconds,
                     self.gap_seconds / self.gap_tokens if self.gap_tokens else None, self.decode_tokens,
                     self.decode_seconds, self.decode_steps, self.decode_sequences, self.sequences)


@dataclass
class _ReaderWindow:
    """One reader's open window: every measurement, and while an experiment runs, each arm's and the blocks closed
    since the reader's previous snapshot."""
    acc: _Accumulator = field(default_factory=_Accumulator)
    arms: dict[str, _Accumulator] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)

    def window(self, config: EngineConfig, arm_configs: dict[str, EngineConfig]) -> Window:
        if not self.arms:
            return self.acc.window(config)
        return self.acc.window(config, blocks=list(self.blocks),
                               arms={name: acc.window(arm_configs[name]) for name, acc in self.arms.items()})


@dataclass(frozen=True)
class StepRecord:
    """What one engine step did. MoE figures (None for dense targets) count (token, expert) pairs: expert_tokens
    [layers, experts], slot_tokens [layers, slots], rank_tokens [layers, ranks], dropped_per_layer [layers]."""
    batch_size: int
    queue_depth: int
    step_seconds: float
    target_seconds: float
    draft_seconds: float
    drafted_per_position: list[int]
    accepted_per_position: list[int]
    num_drafts: int
    prefill_tokens: int
    shadow_lookups: int = 0                             # shadow drafts of prompt lookup this step resolved
    shadow_drafted_per_position: list[int] = field(default_factory=list)
    shadow_accepted_per_position: list[int] = field(default_factory=list)
    expert_tokens: torch.Tensor | None = None
    slot_tokens: torch.Tensor | None = None
    rank_tokens: torch.Tensor | None = None
    dropped_per_layer: torch.Tensor | None = None
    all_to_all_seconds: float = 0.0
    balancedness: float | None = None                   # filled in by Telemetry, once per step, for the sinks
    balancedness_per_layer: list[float | None] | None = None


def add_latencies(samples, count: int, ttft: float | None, gap: float | None) -> None:
    """One delivery of count tokens into samples' ttft and inter_token lists: the gap since the last delivery spread
    evenly over its tokens."""
    if ttft is not None:
        samples.ttft.append(ttft)
    if gap is not None:
        samples.inter_token.extend([gap / count] * count)


def _add_per_position(totals: list[float], counts: list[float]) -> None:
    totals.extend([0] * (len(counts) - len(totals)))
    for i, c in enumerate(counts):
        totals[i] += c


class TelemetrySink(Protocol):
    """Also receives every event the Window is built from (Prometheus metrics, step spans)."""

    def record_config(self, config: EngineConfig) -> None: ...

    def record_step(self, step: StepRecord) -> None: ...

    def record_tokens(self, *, count: int, ttft: float | None, gap: float | None) -> None: ...

    def record_finished(self, e2e: float) -> None: ...


class Telemetry:
    """Written by the engine thread, read by anyone through snapshot(); thread-safe. Each reader has its own window
    (a cursor per reader), so one reader's snapshot never takes data from another. While an Experiment runs, every
    measurement also goes to its arm's accumulator in each reader's window and to the block in progress."""

    def __init__(self, sinks: Sequence[TelemetrySink] = ()):
        self._lock = threading.Lock()
        self._windows: dict[str, _ReaderWindow] = {reader: _ReaderWindow() for reader in READERS}
        self._sinks = tuple(sinks)
        self._arms: dict[str, EngineConfig] = {}
        self._block: _BlockAccumulator | None = None

    def record_config(self, config: EngineConfig) -> None:
        for sink in self._sinks:
            sink.record_config(config)

    def begin_block(self, index: int, arm: str, config: EngineConfig) -> None:
        """Close the switchback block in progress (if any) and start block index under arm."""
        with self._lock:
            if self._block is not None:
                closed = self._block.closed()
                for reader in self._windows.values():
                    reader.blocks.append(closed)
            self._arms[arm] = config
            for reader in self._windows.values():
                reader.arms.setdefault(arm, _Accumulator())
            self._block = _BlockAccumulator(index, arm, config.version)

    def end_experiment(self) -> None:
        """The experiment is over: its unfinished block and the per-arm figures not yet read are dropped."""
        with self._lock:
            self._arms, self._block = {}, None
            for reader in self._windows.values():
                reader.arms, reader.blocks = {}, []

    def _targets(self) -> list[_Accumulator]:
        if self._block is None:
            return [reader.acc for reader in self._windows.values()]
        arm = self._block.arm
        return [acc for reader in self._windows.values() for acc in (reader.acc, reader.arms[arm])]

    def record_step(self, step: StepRecord) -> None:
        if self._sinks:
            step = replace(step, **_balancedness_of(step.rank_tokens))
        for sink in self._sinks:
            sink.record_step(step)
        with self._lock:
            for acc in self._targets():
                acc.add_step(step)
            if self._block is not None:
                self._block.add_step(step)

    def record_replacement(self, seconds: float) -> None:
        """Serving stalled this long while expert weights moved to a new placement."""
        with self._lock:
            for reader in self._windows.values():
                reader.acc.replacement_seconds += seconds

    def record_tokens(self, *, count: int, ttft: float | None, gap: float | None) -> None:
        """count tokens delivered at once; a gap since the previous delivery is spread evenly over them."""
        for sink in self._sinks:
            sink.record_tokens(count=count, ttft=ttft, gap=gap)
        with self._lock:
            for acc in self._targets():
                acc.add_tokens(count, ttft, gap)
            if self._block is not None:
                self._block.emitted_tokens += count
                self._block.step_tokens += count
                if gap is not None:
                    self._block.gap_seconds += gap
                    self._block.gap_tokens += count

    def record_finished(self, e2e: float) -> None:
        for sink in self._sinks:
            sink.record_finished(e2e)
        with self._lock:
            for acc in self._targets():
                acc.add_finished(e2e)

    def snapshot(self, config: EngineConfig, reader: str = "default") -> Window:
        """Close reader's window and open the next; a reader seen for the first time gets an empty window. While an
        experiment runs, the Window holds its blocks completed since reader's previous snapshot and per-arm Windows
        (a block still in progress is reported by a later snapshot)."""
        with self._lock:
            closed = self._windows.pop(reader, None) or self._opened()
            self._windows[reader] = self._opened()
            self._forget_old_readers()
            return closed.window(config, self._arms)

    def peek(self, config: EngineConfig, reader: str = "default") -> Window:
        """reader's window so far, left open."""
        with self._lock:
            return (self._windows.get(reader) or self._opened()).window(config, self._arms)

    def _opened(self) -> _ReaderWindow:
        return _ReaderWindow(arms={arm: _Accumulator() for arm in self._arms})

    def _forget_old_readers(self) -> None:
        """Readers are kept in the order they last read; the oldest non-built-in one goes when there are too many."""
        extra = [reader for reader in self._windows if reader not in READERS]
        for reader in extra[:max(0, len(self._windows) - MAX_READERS)]:
            del self._windows[reader]


def _add(total: torch.Tensor | None, step: torch.Tensor | None) -> torch.Tensor | None:
    return step if total is None else total if step is None else total + step


def _listed(total: torch.Tensor | None) -> list | None:
    return None if total is None else total.tolist()


def _balancedness_of(rank_tokens: torch.Tensor | None) -> dict:
    if rank_tokens is None:
        return {"balancedness": None, "balancedness_per_layer": None}
    per_rank = rank_tokens.cpu().numpy()
    return {"balancedness": balancedness(per_rank),
            "balancedness_per_layer": [balancedness(layer[None]) for layer in per_rank]}
