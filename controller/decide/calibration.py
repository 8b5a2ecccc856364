"""A calibrated what-if: the goodput model's predicted gains, checked against what switchback trials measured.

The model's error grows with the gain it predicts (it sees neither contention nor every cost of a rejected draft),
so it is corrected as a shrink of the predicted log gain: calibrated = raw ^ beta. Each kind of change (draft_len,
spec_method, ...) keeps, for its recent trials, the shrink that would have been exact, log(measured) / log(raw); a
new prediction uses their median, pulled toward a prior shrink while few trials back it. A change at one batch band
uses the kind's trials at that band only: in the controller bench, k trials at 1 sequence of copying under-predicted
(1.16-1.26x predicted, 1.48-1.54x measured) while those at 3-22 sequences over-predicted (1.16x, 0.97x; 1.25x,
0.76x), and pooled with the first, the second were calibrated further up (1.39x raw, 1.72x calibrated, 1.25x
measured). A probe of the other speculation mode changes k to or from 0 at one band, and calibrates the draft_len
what-if there: in the controller bench, a fallback at 12-22 sequences measured plain decoding 1.24-1.29x k 4, and the
model, uncorrected, went on to propose k 0 -> 7 there (1.07x) and to probe speculation again. A predicted gain of
almost nothing says nothing about the shrink, so such trials are not counted. An uncorrected optimism sends the
controller into trials that lose.
"""
from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass

from controller.strategy import PROBES

MEMORY = 20              # trials per kind (and per band) the shrink is estimated from
PRIOR_TRIALS = 2         # weight of the prior against the measured shrink, in trials
PRIOR_SHRINK = 1.0       # the prior beta: the model taken at its word until trials say otherwise (a prior of 0.7, the
                         # median shrink of an earlier model's trials, made the calibrated error larger than the raw
                         # one in three controller bench runs whose trials' shrinks had medians of 1.35-1.40)
MIN_LOG_GAIN = 0.02      # trials predicted within 2 % of no change do not inform the shrink


@dataclass(frozen=True)
class Check:
    kind: str
    raw: float           # what the model predicted
    predicted: float     # the calibrated prediction the controller acted on
    measured: float      # the judge's estimate of candidate / incumbent
    band: int | None = None    # the batch band the change was made at, if at one


class Calibration:
    """Thread-safe: the controller records from its thread, the dashboard and /metrics read from others."""

    def __init__(self):
        self._lock = threading.Lock()
        self._checks: deque[Check] = deque(maxlen=10 * MEMORY)

    def corrected(self, kind: str, raw: float, band: int | None = None) -> float:
        """raw ^ beta, beta: the median measured shrink of the trials of kind's what-if (at band, if one is given),
        pulled toward the prior by PRIOR_TRIALS."""
        with self._lock:
            informative = [c for c in self._checks if _checked_as(c.kind) == _checked_as(kind)
                           and abs(math.log(c.raw)) >= MIN_LOG_GAIN
                           and (band is None or c.band == band)]
        return raw ** _pulled(PRIOR_SHRINK, informative[-MEMORY:])

    def record(self, kind: str, raw: float, predicted: float, measured: float, band: int | None = None) -> None:
        if raw > 0 and predicted > 0 and measured > 0:
            with self._lock:
                self._checks.append(Check(kind, raw, predicted, measured, band))

    def checks(self) -> list[Check]:
        with self._lock:
            return list(self._checks)

    def summary(self) -> dict:
        """Over the trials recorded: median |measured / predicted - 1| and the share over-predicted, for the
        calibrated predictions (what the controller acted on) and the model's raw ones."""
        with self._lock:
            checks = list(self._checks)
        return {"trials": len(checks), **_errors(checks, "predicted"),
                **{f"raw_{name}": value for name, value in _errors(checks, "raw").items()}}


def _checked_as(kind: str) -> str:
    """The what-if a kind of trial checks: a probe of the other speculation mode is a draft_len change (k to or from
    0)."""
    return "draft_len" if kind in PROBES else kind


def _pulled(prior: float, checks: list[Check]) -> float:
    """The checks' median exact shrink, pulled toward prior with the weight of PRIOR_TRIALS trials. A check measured
    on the other side of 1 than predicted has shrink 0 (the prediction said nothing), never below: a negative beta
    reverses every later prediction at the band, and in the controller bench one k 8 -> 4 trial at 1 sequence
    (1.12x predicted, 0.73x measured) turned the model's 0.34x for plain decoding there into 1.05x, and the probe
    it sent measured 0.46x."""
    if not checks:
        return prior
    shrinks = [max(math.log(c.measured) / math.log(c.raw), 0.0) for c in checks]
    return (PRIOR_TRIALS * prior + len(shrinks) * statistics.median(shrinks)) / (PRIOR_TRIALS + len(shrinks))


def _errors(checks: list[Check], field: str) -> dict:
    if not checks:
        return {"median_abs_error": None, "over_predicted_share": None}
    predictions = [getattr(c, field) for c in checks]
    return {"median_abs_error": statistics.median(abs(c.measured / p - 1) for c, p in zip(checks, predictions)),
            "over_predicted_share": sum(p > c.measured for c, p in zip(checks, predictions)) / len(checks)}
