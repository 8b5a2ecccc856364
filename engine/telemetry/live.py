"""A rolling per-second view of the engine for the operator page.

A TelemetrySink fed by the same events as the Window, kept in 1-second buckets in a ring buffer (bounded memory).
Reading it never closes or resets the Window: that belongs to the controller alone.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from engine.telemetry.recorder import StepRecord, add_latencies
from seam import EngineConfig
from seam.placement import balancedness

HISTORY_SECONDS = 300           # buckets kept
MAX_SAMPLES_PER_SECOND = 2_000  # latency samples kept per bucket and distribution
SPAN_SECONDS = 5                # latency percentiles and acceptance at t cover the seconds (t - span, t]
HEAT_SECONDS = 10               # the expert heatmap sums this many trailing seconds


def _samples() -> deque:
    return deque(maxlen=MAX_SAMPLES_PER_SECOND)


@dataclass
class _Second:
    t: int
    steps: int = 0
    emitted: int = 0
    batch_size_sum: int = 0
    queue_depth_sum: int = 0
    step_seconds: float = 0.0
    all_to_all_seconds: float = 0.0
    drafted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    expert_tokens: np.ndarray | None = None
    rank_tokens: np.ndarray | None = None
    ttft: deque = field(default_factory=_samples)
    inter_token: deque = field(default_factory=_samples)
    e2e: deque = field(default_factory=_samples)


class LiveTelemetry:
    """Thread-safe: written by the engine thread, read by the page's server."""

    def __init__(self, clock=time.time):
        self._clock = clock
        self._lock = threading.Lock()
        self._seconds: deque[_Second] = deque(maxlen=HISTORY_SECONDS)

    def _bucket(self) -> _Second:
        now = int(self._clock())
        if not self._seconds or self._seconds[-1].t != now:
            self._seconds.append(_Second(now))
        return self._seconds[-1]

    # -- TelemetrySink ----------------------------------------------------------------------------

    def record_config(self, config: EngineConfig) -> None:
        """Not kept: the page reads the config in use from the controller (or the engine)."""

    def record_step(self, step: StepRecord) -> None:
        experts, ranks = _array(step.expert_tokens), _array(step.rank_tokens)
        with self._lock:
            second = self._bucket()
            second.steps += 1
            second.batch_size_sum += step.batch_size
            second.queue_depth_sum += step.queue_depth
            second.step_seconds += step.step_seconds
            second.all_to_all_seconds += step.all_to_all_seconds
            second.drafted = _sum(second.drafted, np.asarray(step.drafted_per_position, dtype=float))
            second.accepted = _sum(second.accepted, np.asarray(step.accepted_per_position, dtype=float))
            if experts is not None:
                second.expert_tokens = experts if second.expert_tokens is None else _sum(second.expert_tokens, experts)
            if ranks is not None:
                second.rank_tokens = ranks if second.rank_tokens is None else _sum(second.rank_tokens, ranks)

    def record_tokens(self, *, count: int, ttft: float | None, gap: float | None) -> None:
        with self._lock:
            second = self._bucket()
            second.emitted += count
            add_latencies(second, count, ttft, gap)

    def record_finished(self, e2e: float) -> None:
        with self._lock:
            self._bucket().e2e.append(e2e)

    # -- reads ------------------------------------------------------------------------------------

    def series(self, seconds: int = 120) -> dict:
        """Per completed second of the last `seconds`, from the first event on (seconds without events count as
        idle): goodput, load, balancedness, communication share; latency percentiles and acceptance (overall and per
        draft position) over the trailing SPAN_SECONDS; the expert heat of the trailing HEAT_SECONDS."""
        end = int(self._clock())                      # the current second is still filling: left out
        with self._lock:
            first = self._seconds[0].t if self._seconds else end
            by_t = {s.t: s for s in self._seconds if end - seconds - SPAN_SECONDS < s.t < end}
        times = list(range(max(end - seconds, first), end))
        rows = [by_t.get(t) or _Second(t) for t in times]
        spans = [[by_t[u] for u in range(t - SPAN_SECONDS + 1, t + 1) if u in by_t] for t in times]
        drafted = [_sum_all([s.drafted for s in span]) for span in spans]
        accepted = [_sum_all([s.accepted for s in span]) for span in spans]
        positions = max((len(d) for d in drafted), default=0)
        out = {"t": times, "goodput": [r.emitted for r in rows],
               "batch_size": [_ratio(r.batch_size_sum, r.steps) for r in rows],
               "queue_depth": [_ratio(r.queue_depth_sum, r.steps) for r in rows],
               "balancedness": [None if r.rank_tokens is None else balancedness(r.rank_tokens) for r in rows],
               "comm_share": [_ratio(r.all_to_all_seconds, r.step_seconds) for r in rows],
               "acceptance": [_ratio(a.sum(), d.sum()) for a, d in zip(accepted, drafted)],
               "acceptance_per_position": [[_ratio(_at(a, p), _at(d, p)) for a, d in zip(accepted, drafted)]
                                           for p in range(positions)],
               "span_seconds": SPAN_SECONDS, "heat_seconds": HEAT_SECONDS}
        for name in ("ttft", "inter_token", "e2e"):
            p50, p99 = [], []
            for span in spans:
                samples = [v for second in span for v in getattr(second, name)]
                low, high = np.percentile(samples, [50, 99]).tolist() if samples else (None, None)
                p50.append(low)
                p99.append(high)
            out[f"{name}_p50"], out[f"{name}_p99"] = p50, p99
        out["expert_heat"] = _heat([by_t[t].expert_tokens for t in times[-HEAT_SECONDS:] if t in by_t])
        return out


def _array(values) -> np.ndarray | None:
    if values is None:
        return None
    return np.asarray(values.tolist() if hasattr(values, "tolist") else values, dtype=float)


def _sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape != b.shape:
        shape = np.maximum(a.shape, b.shape)
        a, b = (np.pad(x, [(0, n - m) for n, m in zip(shape, x.shape)]) for x in (a, b))
    return a + b


def _sum_all(arrays: list[np.ndarray]) -> np.ndarray:
    """Element-wise sum of arrays of one rank, padded to the longest; an empty 1-D array if there are none."""
    total = arrays[0] if arrays else np.zeros(0)
    for array in arrays[1:]:
        total = _sum(total, array)
    return total


def _at(values: np.ndarray, index: int) -> float:
    return float(values[index]) if index < len(values) else 0.0


def _ratio(part: float, whole: float) -> float | None:
    return float(part) / float(whole) if whole else None


def _heat(grids: list[np.ndarray | None]) -> list[list[float]] | None:
    """Share of each layer's routed tokens that went to each expert (rows: layers)."""
    grids = [g for g in grids if g is not None]
    if not grids:
        return None
    total = _sum_all(grids)
    per_layer = total.sum(axis=1, keepdims=True)
    return np.divide(total, per_layer, out=np.zeros_like(total), where=per_layer > 0).tolist()
