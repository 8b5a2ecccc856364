"""The controller's counters, behind a small sink interface the service's Prometheus registry can implement."""
from __future__ import annotations

import threading
from collections import Counter
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PrometheusCounter


class MetricsSink(Protocol):
    def decision(self, action: str) -> None:
        """governor_controller_decisions_total{action}"""

    def rollback(self) -> None:
        """governor_controller_rollbacks_total"""

    def trial(self, outcome: str) -> None:
        """governor_controller_trials_total{outcome}"""

    def calibration(self, summary: dict) -> None:
        """governor_controller_calibration{figure}: controller.decide.calibration.Calibration.summary()'s numbers"""


class CountingSink:
    """Counts in memory; the default when no Prometheus registry is hooked up."""

    def __init__(self):
        self._lock = threading.Lock()
        self.decisions: Counter[str] = Counter()
        self.trials: Counter[str] = Counter()
        self.rollbacks = 0
        self.calibration_summary: dict = {}

    def decision(self, action: str) -> None:
        with self._lock:
            self.decisions[action] += 1

    def rollback(self) -> None:
        with self._lock:
            self.rollbacks += 1

    def trial(self, outcome: str) -> None:
        with self._lock:
            self.trials[outcome] += 1

    def calibration(self, summary: dict) -> None:
        with self._lock:
            self.calibration_summary = dict(summary)


class PrometheusCounters:
    """The same counters on a Prometheus registry (the engine's, so /metrics serves them), labelled by model."""

    def __init__(self, registry: CollectorRegistry, model: str):
        self._decisions = PrometheusCounter("governor_controller_decisions", "Controller decisions recorded, by action",
                                  ("model", "action"), registry=registry)
        self._rollbacks = PrometheusCounter("governor_controller_rollbacks", "Rollbacks to the last known good config",
                                  ("model",), registry=registry).labels(model)
        self._trials = PrometheusCounter("governor_controller_trials", "Trials judged, by outcome", ("model", "outcome"),
                               registry=registry)
        self._calibration = Gauge("governor_controller_calibration", "Predicted vs measured trial gains: trials, "
                                  "median_abs_error (median |measured/predicted - 1|), over_predicted_share, and the "
                                  "same of the uncalibrated model (raw_...)", ("model", "figure"), registry=registry)
        self._model = model

    def decision(self, action: str) -> None:
        self._decisions.labels(self._model, action).inc()

    def rollback(self) -> None:
        self._rollbacks.inc()

    def trial(self, outcome: str) -> None:
        self._trials.labels(self._model, outcome).inc()

    def calibration(self, summary: dict) -> None:
        for figure, value in summary.items():
            if value is not None:
                self._calibration.labels(self._model, figure).set(value)
