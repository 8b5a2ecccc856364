"""A calibrated what-if: the goodput model's predicted gains, checked against what switchback trials measured.

Each kind of change (draft_len, spec_method, ...) keeps the log ratios measured / predicted of its recent trials. A
new prediction is corrected by their median (the kind's bias), shrunk toward a prior that halves the predicted
gain while few trials back the median: the model has been optimistic (it sees neither contention nor the cost of a
rejected draft), and an uncorrected optimism sends the controller into trials that lose.
"""
from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass

MEMORY = 20              # trials per kind the bias is estimated from
PRIOR_TRIALS = 2         # weight of the prior against the measured bias, in trials
PRIOR_SHRINK = 0.5       # the prior: a predicted log gain is halved


@dataclass(frozen=True)
class Check:
    kind: str
    raw: float           # what the model predicted
    predicted: float     # the calibrated prediction the controller acted on
    measured: float      # the judge's estimate of candidate / incumbent


class Calibration:
    """Thread-safe: the controller records from its thread, the dashboard and /metrics read from others."""

    def __init__(self):
        self._lock = threading.Lock()
        self._checks: deque[Check] = deque(maxlen=10 * MEMORY)

    def corrected(self, kind: str, raw: float) -> float:
        """raw corrected by kind's measured bias (in log space), shrunk toward the prior."""
        with self._lock:
            logs = [math.log(c.measured / c.raw) for c in self._checks if c.kind == kind][-MEMORY:]
        prior = -PRIOR_SHRINK * math.log(raw)
        bias = (sum([prior] * PRIOR_TRIALS) + len(logs) * statistics.median(logs or [0.0])) / (PRIOR_TRIALS + len(logs))
        return raw * math.exp(bias)

    def record(self, kind: str, raw: float, predicted: float, measured: float) -> None:
        if raw > 0 and predicted > 0 and measured > 0:
            with self._lock:
                self._checks.append(Check(kind, raw, predicted, measured))

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


def _errors(checks: list[Check], field: str) -> dict:
    if not checks:
        return {"median_abs_error": None, "over_predicted_share": None}
    predictions = [getattr(c, field) for c in checks]
    return {"median_abs_error": statistics.median(abs(c.measured / p - 1) for c, p in zip(checks, predictions)),
            "over_predicted_share": sum(p > c.measured for c, p in zip(checks, predictions)) / len(checks)}
