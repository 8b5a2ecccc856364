"""The controller's counters, behind a small sink interface the service's Prometheus registry can implement."""
from __future__ import annotations

import threading
from collections import Counter
from typing import Protocol


class MetricsSink(Protocol):
    def decision(self, action: str) -> None:
        """governor_controller_decisions_total{action}"""

    def rollback(self) -> None:
        """governor_controller_rollbacks_total"""

    def trial(self, outcome: str) -> None:
        """governor_controller_trials_total{outcome}"""


class CountingSink:
    """Counts in memory; the default when no Prometheus registry is hooked up."""

    def __init__(self):
        self._lock = threading.Lock()
        self.decisions: Counter[str] = Counter()
        self.trials: Counter[str] = Counter()
        self.rollbacks = 0

    def decision(self, action: str) -> None:
        with self._lock:
            self.decisions[action] += 1

    def rollback(self) -> None:
        with self._lock:
            self.rollbacks += 1

    def trial(self, outcome: str) -> None:
        with self._lock:
            self.trials[outcome] += 1
