"""The controller arm's record for `governor bench controller`: when each config was applied, and the timeline
figure (goodput per arm over time, phases shaded, and the config the controller had in use)."""
from __future__ import annotations

import time

import numpy as np

from controller.clients import InProcessClient
from controller.decide.schedule import schedule_text
from governor.bench.adaptation_workload import good_deliveries
from policies import Policy
from seam import EngineConfig, Experiment

BIN_SECONDS = 2.0


class RecordingClient(InProcessClient):
    """The in-process client, noting when each config (or switchback trial) is applied."""

    def __init__(self, engine):
        super().__init__(engine)
        self.applies: list[dict] = []
        self.started = time.perf_counter()

    def apply(self, change: EngineConfig | Experiment) -> None:
        super().apply(change)
        trial = isinstance(change, Experiment)
        config = change.candidate if trial else change
        self.applies.append({"time": time.time(), "config": label(config), "trial": trial,
                             "version": config.version})


def label(config: EngineConfig) -> str:
    if config.longest_draft_len == 0:
        return "plain"
    return f"{config.spec_method} {schedule_text(config)}"


def figure(arms: dict[str, dict], specs, policy: Policy, controller: str):
    """arms: name -> {"result": RunResult, ...}; the controller's arm also has "applies"."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 6.5))
    goodput_axes, config_axes = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.4])
    total = sum(spec.seconds for spec in specs)
    first = next(iter(arms.values()))["result"]
    for i, spec in enumerate(specs):
        begin = first.phase_starts[spec.name]
        for axes in (goodput_axes, config_axes):
            axes.axvspan(begin, begin + spec.seconds, color=f"C{i}", alpha=0.08)
        goodput_axes.text(begin + 0.3, 0.97, f"{spec.name} (c={spec.concurrency})", fontsize=8, va="top",
                          transform=goodput_axes.get_xaxis_transform())
    edges = np.arange(0, total + BIN_SECONDS, BIN_SECONDS)
    bounds = (policy.slo.ttft_p99_seconds, policy.slo.inter_token_p99_seconds)
    for name, arm in arms.items():
        delivered = good_deliveries(arm["result"], *bounds)
        tokens, _ = np.histogram([t for t, _ in delivered], bins=edges, weights=[n for _, n in delivered])
        style = {"linewidth": 2.5, "color": "black"} if name == controller else {"linewidth": 1, "alpha": 0.8}
        goodput_axes.plot(edges[:-1] + BIN_SECONDS / 2, tokens / BIN_SECONDS, label=name, **style)
    goodput_axes.set_ylim(bottom=0)
    goodput_axes.set_ylabel("goodput, tokens/s (SLO met)")
    goodput_axes.set_title("governor bench controller: closed-loop phases, controller vs static configs (repetition 1)")
    goodput_axes.legend(fontsize=8, loc="upper right")
    _config_timeline(config_axes, arms[controller], total)
    return fig


def _config_timeline(axes, arm: dict, total: float) -> None:
    """The configs the controller kept during the measured pass, as labelled spans (the first: what it kept from
    its earlier passes, if any); its switchback trials as ticks."""
    started = arm["result"].started_at
    kept = [a for a in arm["applies"] if not a["trial"]]
    learned = [a["config"] for a in kept if a["time"] < started]
    trials = [a["time"] - started for a in arm["applies"] if a["trial"] and a["time"] >= started]
    spans = [(0.0, f"from the earlier passes: {learned[-1]}" if learned else "start: default config")]
    spans += [(a["time"] - started, a["config"]) for a in kept if a["time"] >= started]
    for i, (begin, text) in enumerate(spans):
        end = spans[i + 1][0] if i + 1 < len(spans) else total
        axes.barh(0, end - begin, left=begin, height=0.6, color=f"C{i % 10}", alpha=0.5)
        axes.text(begin, 0.45 - 0.3 * (i % 3), text, fontsize=6, va="center")
    axes.plot(trials, [-0.5] * len(trials), "|", color="black", markersize=8, label="switchback trial started")
    axes.set_yticks([])
    axes.set_ylim(-0.8, 0.8)
    axes.set_xlabel("seconds into the run")
    axes.legend(fontsize=7, loc="lower right")
