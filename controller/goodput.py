"""Expected goodput as a function of draft length k, from what the live engine measured.

Per sequence-step, k drafts yield E(k) = 1 + s_0 + ... + s_{k-1} tokens, s_j being the measured share of drafts
accepted through position j (positions never measured extrapolate geometrically from the last measured ratio). A
step costs overhead + target(k) + draft(k) seconds. Costs are measured per batch-size band (powers of two of the
mean batch) and per k, because verification on an MoE target costs more as k and the batch grow. Between and above
the k measured, a line through them (slope >= 0; one point: flat); below them, the smallest k's cost. A cost is the
lowest of the last few windows' figures: other work on the machine only ever adds time.
Predicted tokens per busy second at k, relative to the current k: E(k) / E(k0) * cost(k0) / cost(k).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from seam import Window

RECENT_WINDOWS = 5


def batch_band(batch_size_mean: float) -> int:
    return round(math.log2(max(batch_size_mean, 1.0)))


@dataclass
class _Costs:
    """Measured seconds per step at each k: the lowest of the last RECENT_WINDOWS windows at that k."""
    recent: dict[int, deque] = field(default_factory=dict)

    def observe(self, k: int, seconds: float) -> None:
        self.recent.setdefault(k, deque(maxlen=RECENT_WINDOWS)).append(seconds)

    @property
    def per_k(self) -> dict[int, float]:
        return {k: min(values) for k, values in self.recent.items()}

    def at(self, k: int) -> float | None:
        per_k = self.per_k
        if not per_k:
            return None
        if k in per_k:
            return per_k[k]
        ks = sorted(per_k)
        if len(ks) == 1 or k < ks[0]:
            return per_k[ks[0]]
        slope, intercept = np.polyfit(ks, [per_k[x] for x in ks], 1)
        if slope < 0:
            return per_k[max(x for x in ks if x <= k)]
        return float(intercept + slope * k)


@dataclass
class _Band:
    target: _Costs = field(default_factory=_Costs)
    draft: _Costs = field(default_factory=_Costs)
    overheads: deque = field(default_factory=lambda: deque(maxlen=RECENT_WINDOWS))

    @property
    def overhead(self) -> float | None:
        return min(self.overheads, default=None)


@dataclass
class Prediction:
    k: int
    tokens_per_step: float
    seconds_per_step: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.seconds_per_step


class GoodputModel:
    def __init__(self, memory: float = 0.5):
        self.memory = memory                 # weight of the newest window in the acceptance counts
        self.drafted: list[float] = []       # decayed counts per draft position
        self.accepted: list[float] = []
        self.bands: dict[int, _Band] = {}

    def observe(self, window: Window) -> None:
        if window.steps == 0:
            return
        k, band = window.draft_len, self.bands.setdefault(batch_band(window.batch_size_mean), _Band())
        band.target.observe(k, window.target_forward_seconds / window.steps)
        if k > 0:
            band.draft.observe(k, window.draft_forward_seconds / window.steps)
        band.overheads.append((window.step_seconds - window.target_forward_seconds - window.draft_forward_seconds)
                              / window.steps)
        for j, (d, a) in enumerate(zip(window.drafted_per_position, window.accepted_per_position)):
            if j >= len(self.drafted):
                self.drafted.append(0.0)
                self.accepted.append(0.0)
            self.drafted[j] = (1 - self.memory) * self.drafted[j] + d
            self.accepted[j] = (1 - self.memory) * self.accepted[j] + a

    def ready(self, band: int) -> bool:
        costs = self.bands.get(band)
        return costs is not None and bool(costs.target.per_k) and bool(costs.draft.per_k) and bool(self.survival())

    def measured_bands(self) -> set[int]:
        return {band for band in self.bands if self.ready(band)}

    def measured_plain(self, band: int) -> bool:
        """Has a window of plain decoding measured the target's cost at k = 0 in band?"""
        return band in self.bands and 0 in self.bands[band].target.per_k

    def measured_ks(self, band: int) -> list[int]:
        return sorted(self.bands[band].draft.per_k) if band in self.bands else []

    def survival(self) -> list[float]:
        """s_j: share of drafts accepted through position j, for the positions measured."""
        return [a / d for d, a in zip(self.drafted, self.accepted) if d > 0]

    def expected_tokens(self, k: int) -> float:
        s = self.survival()
        if k > len(s):
            ratio = s[-1] / s[-2] if len(s) >= 2 and s[-2] > 0 else s[-1]
            ratio = min(max(ratio, 0.0), 1.0)
            s = s + [s[-1] * ratio ** (j + 1) for j in range(k - len(s))]
        return 1.0 + sum(s[:k])

    def predict(self, k: int, band: int) -> Prediction:
        costs = self.bands[band]
        seconds = costs.overhead + costs.target.at(k) + (costs.draft.at(k) if k > 0 else 0.0)
        return Prediction(k, self.expected_tokens(k) if k > 0 else 1.0, max(seconds, 1e-9))

    def gain(self, candidate: int, current: int, band: int) -> float:
        """Predicted tokens per busy second at candidate over current."""
        return self.predict(candidate, band).tokens_per_second / self.predict(current, band).tokens_per_second

    def best(self, ks: range, band: int) -> Prediction:
        return max((self.predict(k, band) for k in ks), key=lambda p: p.tokens_per_second)

    def describe(self, band: int) -> dict:
        costs = self.bands.get(band, _Band())
        return {"survival": [round(s, 4) for s in self.survival()], "batch_band": band,
                "target_seconds_per_step": {k: round(v, 6) for k, v in sorted(costs.target.per_k.items())},
                "draft_seconds_per_step": {k: round(v, 6) for k, v in sorted(costs.draft.per_k.items())},
                "overhead_seconds_per_step": None if costs.overhead is None else round(costs.overhead, 6)}
