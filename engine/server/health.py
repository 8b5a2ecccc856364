"""Liveness and readiness that tell the truth: each component has a probe that answers None when it works, or
the reason it does not. /health and /ready answer 503 with those reasons; /metrics exports governor_up per component.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
Probe = Callable[[], "str | None"]


class Health:
    """The service's components (engine, expert_parallel, controller, store) and their probes."""

    def __init__(self, probes: dict[str, Probe] | None = None):
        self._probes: dict[str, Probe] = dict(probes or {})

    def add(self, component: str, probe: Probe) -> None:
        self._probes[component] = probe

    def status(self) -> dict[str, str | None]:
        """component -> None if it works, else why not (a probe that raises is down, with its error)."""
        return {component: _ask(probe) for component, probe in self._probes.items()}

    def problems(self) -> dict[str, str]:
        return {component: reason for component, reason in self.status().items() if reason is not None}


class UpCollector(Collector):
    """governor_up{component}: 1 while the component works, 0 while it does not; read when scraped."""

    def __init__(self, health: Health, model: str):
        self.health, self.model = health, model

    def collect(self):
        family = GaugeMetricFamily("governor_up", "1 if the component works, 0 if not (its reason is on /health)",
                                   labels=("model", "component"))
        for component, reason in self.health.status().items():
            family.add_metric((self.model, component), 0.0 if reason else 1.0)
        yield family


def _ask(probe: Probe) -> str | None:
    try:
        return probe()
    except Exception as error:  # a probe that cannot answer is itself the fault to report
        log.warning("health probe failed: %r", error)
        return f"the probe failed: {error!r}"
