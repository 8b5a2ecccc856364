"""Accumulates the engine's own measurements and closes them into Windows."""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from engine.placement import balancedness
from seam import EngineConfig, LatencySummary, Window

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
    expert_tokens: torch.Tensor | None = None
    slot_tokens: torch.Tensor | None = None
    rank_tokens: torch.Tensor | None = None
    dropped_per_layer: torch.Tensor | None = None
    all_to_all_seconds: float = 0.0
    balancedness: float | None = None                   # filled in by Telemetry, once per step, for the sinks
    balancedness_per_layer: list[float | None] | None = None


def _add_per_position(totals: list[int], counts: list[int]) -> None:
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
    (a cursor per reader), so one reader's snapshot never takes data from another."""

    def __init__(self, sinks: Sequence[TelemetrySink] = ()):
        self._lock = threading.Lock()
        self._windows: dict[str, _Accumulator] = {reader: _Accumulator() for reader in READERS}
        self._sinks = tuple(sinks)

    def record_config(self, config: EngineConfig) -> None:
        for sink in self._sinks:
            sink.record_config(config)

    def record_step(self, step: StepRecord) -> None:
        if self._sinks:
            step = replace(step, **_balancedness_of(step.rank_tokens))
        for sink in self._sinks:
            sink.record_step(step)
        with self._lock:
            for acc in self._windows.values():
                acc.steps += 1
                acc.batch_sizes.append(step.batch_size)
                acc.queue_depths.append(step.queue_depth)
                acc.step_seconds += step.step_seconds
                acc.target_forward_seconds += step.target_seconds
                acc.draft_forward_seconds += step.draft_seconds
                acc.num_drafts += step.num_drafts
                acc.prefill_tokens += step.prefill_tokens
                _add_per_position(acc.drafted_per_position, step.drafted_per_position)
                _add_per_position(acc.accepted_per_position, step.accepted_per_position)
                acc.all_to_all_seconds += step.all_to_all_seconds
                acc.expert_tokens = _add(acc.expert_tokens, step.expert_tokens)
                acc.slot_tokens = _add(acc.slot_tokens, step.slot_tokens)
                acc.rank_tokens = _add(acc.rank_tokens, step.rank_tokens)
                acc.dropped_per_layer = _add(acc.dropped_per_layer, step.dropped_per_layer)

    def record_replacement(self, seconds: float) -> None:
        """Serving stalled this long while expert weights moved to a new placement."""
        with self._lock:
            for acc in self._windows.values():
                acc.replacement_seconds += seconds

    def record_tokens(self, *, count: int, ttft: float | None, gap: float | None) -> None:
        """count tokens delivered at once; a gap since the previous delivery is spread evenly over them."""
        for sink in self._sinks:
            sink.record_tokens(count=count, ttft=ttft, gap=gap)
        with self._lock:
            for acc in self._windows.values():
                acc.emitted_tokens += count
                if ttft is not None:
                    acc.ttft.append(ttft)
                if gap is not None:
                    acc.inter_token.extend([gap / count] * count)

    def record_finished(self, e2e: float) -> None:
        for sink in self._sinks:
            sink.record_finished(e2e)
        with self._lock:
            for acc in self._windows.values():
                acc.finished_requests += 1
                acc.e2e.append(e2e)

    def snapshot(self, config: EngineConfig, reader: str = "default") -> Window:
        """Close reader's window and open the next; a reader seen for the first time gets an empty window."""
        with self._lock:
            acc = self._windows.pop(reader, None) or _Accumulator()
            self._windows[reader] = _Accumulator()
            self._forget_old_readers()
            return _window(acc, config)

    def peek(self, config: EngineConfig, reader: str = "default") -> Window:
        """reader's window so far, left open."""
        with self._lock:
            return _window(self._windows.get(reader) or _Accumulator(), config)

    def _forget_old_readers(self) -> None:
        """Readers are kept in the order they last read; the oldest non-built-in one goes when there are too many."""
        extra = [reader for reader in self._windows if reader not in READERS]
        for reader in extra[:max(0, len(self._windows) - MAX_READERS)]:
            del self._windows[reader]


def _window(acc: _Accumulator, config: EngineConfig) -> Window:
    sizes, depths = acc.batch_sizes or [0], acc.queue_depths or [0]
    return Window(
        start=acc.start, end=time.time(), config_version=config.version, spec_method=config.spec_method,
        draft_len=config.speculative_len, steps=acc.steps, num_drafts=acc.num_drafts,
        drafted_tokens=sum(acc.drafted_per_position), accepted_tokens=sum(acc.accepted_per_position),
        drafted_per_position=list(acc.drafted_per_position),
        accepted_per_position=list(acc.accepted_per_position),
        emitted_tokens=acc.emitted_tokens, prefill_tokens=acc.prefill_tokens,
        finished_requests=acc.finished_requests, target_forward_seconds=acc.target_forward_seconds,
        draft_forward_seconds=acc.draft_forward_seconds, step_seconds=acc.step_seconds,
        ttft_seconds=LatencySummary.of(list(acc.ttft)), inter_token_seconds=LatencySummary.of(list(acc.inter_token)),
        e2e_seconds=LatencySummary.of(list(acc.e2e)), batch_size_mean=sum(sizes) / len(sizes),
        batch_size_max=max(sizes), queue_depth_mean=sum(depths) / len(depths), queue_depth_max=max(depths),
        expert_tokens=_listed(acc.expert_tokens), slot_tokens=_listed(acc.slot_tokens),
        rank_tokens=_listed(acc.rank_tokens),
        dropped_tokens=0 if acc.dropped_per_layer is None else int(acc.dropped_per_layer.sum()),
        dropped_per_layer=_listed(acc.dropped_per_layer),
        **_balancedness_of(acc.rank_tokens),
        all_to_all_seconds=acc.all_to_all_seconds, capacity_factor=config.capacity_factor,
        replacement_seconds=acc.replacement_seconds)


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
