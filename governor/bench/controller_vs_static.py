"""`governor bench controller`: the controller against static configs on phase-shifting traffic.

The load generator sends the same phases (code at temperature 0, prose at high temperature, code again at another
QPS) to one engine per arm, each served in-process over loopback HTTP: the controller (starting from the engine's
default config), each static config, and the per-phase oracle (the best static arm in each phase, from those runs).
Goodput counts the output tokens of requests that met the policy's SLO (TTFT and mean inter-token latency). Writes
controller.json and controller.png (goodput over time per arm, the controller's config changes, phases shaded).
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from controller.clients import InProcessClient
from controller.plane import build_control_plane
from engine.api import create_app
from engine.engine import Engine
from engine.loadgen import LoadResult, Phase, run_phases
from engine.local_server import serving_in_thread
from engine.service import EngineService
from governor.bench import report
from governor.control_cli import policy_or_none
from governor.loaders import load_models
from policies import Policy
from seam import EngineConfig, Experiment

NAME = "controller"
HELP = "the controller vs static configs and the per-phase oracle on phase-shifting load"
STATIC = {"plain": EngineConfig(spec_method="off", draft_len=0),
          "draft k=2": EngineConfig(spec_method="draft_model", draft_len=2),
          "draft k=4": EngineConfig(spec_method="draft_model", draft_len=4),
          "draft k=8": EngineConfig(spec_method="draft_model", draft_len=8),
          "ngram k=4": EngineConfig(spec_method="ngram", draft_len=4)}
QUICK_STATIC = ("plain", "ngram k=4")
CONTROLLER = "controller"
LOW_ACCEPTANCE_PHASE = "prose-hot"
BIN_SECONDS = 2.0
KEPT = ("keep", "fallback", "reenable")
TARGETS = {"oracle_ratio": 0.95, "best_static_ratio": 1.10, "low_acceptance_vs_plain": 0.98}


@dataclass
class Arm:
    name: str
    result: LoadResult
    applies: list[dict] = field(default_factory=list)       # the controller's config changes, seconds into the run
    decisions: list[dict] = field(default_factory=list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smoke test: short phases, two static arms")
    parser.add_argument("--phase-seconds", type=float, default=30.0, help="length of each of the three phases")
    parser.add_argument("--qps", type=float, default=5.0, help="arrival rate of the first code phase")
    parser.add_argument("--prose-qps", type=float, default=5.0, help="arrival rate of the prose phase")
    parser.add_argument("--shifted-qps", type=float, default=2.5, help="arrival rate of the last code phase")
    parser.add_argument("--prose-temperature", type=float, default=1.5)
    parser.add_argument("--max-tokens", type=report.int_in(1, 1024), default=64)
    parser.add_argument("--policy", default="responsive", help="the controller's policy file or shipped name")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for controller.json/.png")


def run(args: argparse.Namespace) -> int:
    policy = policy_or_none(args.policy, "governor bench controller: --policy")
    if policy is None:
        return 2
    if args.quick:
        args.phase_seconds, args.max_tokens = min(args.phase_seconds, 4.0), min(args.max_tokens, 16)
    phases = _phases(args)
    models = load_models("governor-moe", device=torch.device("cpu"), dtype=torch.float32)
    names = QUICK_STATIC if args.quick else tuple(STATIC)
    arms = []
    for name in (*names, CONTROLLER):
        report.progress(f"[{len(arms) + 1}/{len(names) + 1}] {name}: {len(phases)} phases of {args.phase_seconds:g} s")
        arms.append(_run_arm(name, models, phases, policy))
    data = _report(arms, phases, policy, args)
    verdicts = [f"target {target['name']}: {target['value']:.3f} vs {target['target']:.2f} -> "
                f"{'met' if target['met'] else 'NOT met'}" for target in data["targets"].values()]
    report.write_results(args.out, "controller", data, _figure(arms, phases, policy),
                         "\n".join([_table(data), *verdicts]))
    return 0


def _phases(args: argparse.Namespace) -> list[Phase]:
    common = {"duration_s": args.phase_seconds, "max_tokens": args.max_tokens, "arrival": "poisson"}
    return [Phase(name="code-greedy", qps=args.qps, prompts="code", temperature=0.0, **common),
            Phase(name=LOW_ACCEPTANCE_PHASE, qps=args.prose_qps, prompts="prose",
                  temperature=args.prose_temperature, **common),
            Phase(name="code-shifted-qps", qps=args.shifted_qps, prompts="code", temperature=0.0, **common)]


# -- running one arm ---------------------------------------------------------------------------------------------


class _RecordingClient(InProcessClient):
    """The in-process client, noting when each config is applied."""

    def __init__(self, engine, applies: list[dict]):
        super().__init__(engine)
        self.applies = applies

    def apply(self, change: EngineConfig | Experiment) -> None:
        super().apply(change)
        config = change.candidate if isinstance(change, Experiment) else change
        label = f"trial {_label(config)}" if isinstance(change, Experiment) else _label(config)
        self.applies.append({"time": time.time(), "config": label, "version": config.version})


def _run_arm(name: str, models, phases: list[Phase], policy: Policy) -> Arm:
    config = STATIC.get(name, EngineConfig())
    engine = Engine(models.target, models.tokenizer, models.draft, config)
    service = EngineService(engine)
    if name != CONTROLLER:
        with _serving(service, None) as url:
            return Arm(name, _load(url, phases))
    applies: list[dict] = []
    decided_at: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        plane = build_control_plane(_RecordingClient(engine, applies), policy, f"sqlite:///{folder}/bench.db",
                                    None, policy_name="bench",
                                    on_decision=lambda id_, action, reason: decided_at.setdefault(id_, time.time()))
        controller = plane.controller
        with _serving(service, plane.router) as url:
            applies.clear()                   # the first-start apply re-labels the same knobs; not a change
            controller.start()
            try:
                result = _load(url, phases)
            finally:
                controller.stop()
        decisions = controller.store.decisions(10_000)
    for apply in applies:
        apply["time"] -= result.started_at
    return Arm(name, result, applies, [_decision(d, decided_at[d["id"]] - result.started_at)
                                       for d in reversed(decisions)])


def _load(url: str, phases: list[Phase]) -> LoadResult:
    return asyncio.run(run_phases(url, phases, seed=0, drain_timeout_s=30.0))


def _serving(service, admin_router):
    return serving_in_thread(create_app(service, "governor-moe", None, admin_router=admin_router), service)


def _decision(row: dict, seconds: float) -> dict:
    return {"time": round(seconds, 2), "action": row["action"], "reason": row["reason"],
            "predicted_gain": row["predicted_gain"], "measured_gain": row["measured_gain"],
            "config_version": row["config_version"]}


def _label(config: EngineConfig) -> str:
    return "plain" if config.speculative_len == 0 else f"{config.spec_method} k={config.draft_len}"


# -- figures -----------------------------------------------------------------------------------------------------


def _good(record, policy: Policy) -> bool:
    """Met the SLO: completed, TTFT within bound, mean inter-token gap within bound."""
    if not record.ok or record.ttft_s is None:
        return False
    gaps = record.itl_s
    return record.ttft_s <= policy.slo.ttft_p99_seconds and (
        not gaps or float(np.mean(gaps)) <= policy.slo.inter_token_p99_seconds)


def _phase_figures(arm: Arm, phase: Phase, policy: Policy) -> dict:
    records = [r for r in arm.result.records if r.phase == phase.name]
    summary = next(s for s in arm.result.phases if s.name == phase.name)
    good = sum(r.output_tokens for r in records if _good(r, policy))
    return {"goodput_tokens_per_s": good / phase.duration_s, "tokens_per_s": summary.tokens_per_s,
            "requests": summary.requests, "completed": summary.completed,
            "slo_met": sum(_good(r, policy) for r in records),
            "ttft_p99_s": summary.ttft_s and summary.ttft_s["p99"], "itl_p99_s": summary.itl_s and summary.itl_s["p99"]}


def _overall(arm: Arm, phases: list[Phase], policy: Policy) -> dict:
    ok = [r for r in arm.result.records if r.ok]
    good = sum(r.output_tokens for r in arm.result.records if _good(r, policy))
    itl = [g for r in ok for g in r.itl_s]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    return {"goodput_tokens_per_s": good / sum(p.duration_s for p in phases),
            "itl_p99_s": float(np.percentile(itl, 99)) if itl else None,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else None}


def _retune_seconds(arm: Arm, phases: list[Phase]) -> list[dict]:
    """Per phase: seconds from its start to the controller's first kept change (keep, fallback or re-enable)."""
    out, start = [], 0.0
    for phase in phases:
        end = start + phase.duration_s
        kept = [d for d in arm.decisions if d["action"] in KEPT and start <= d["time"] < end]
        served = [a["config"] for a in arm.applies if a["time"] < end]
        out.append({"phase": phase.name, "seconds": round(kept[0]["time"] - start, 2) if kept else None,
                    "kept_changes": len(kept), "config_at_end": served[-1] if served else "initial"})
        start = end
    return out


def _report(arms: list[Arm], phases: list[Phase], policy: Policy, args: argparse.Namespace) -> dict:
    per_arm = {arm.name: {"phases": {p.name: _phase_figures(arm, p, policy) for p in phases},
                          "overall": _overall(arm, phases, policy)} for arm in arms}
    static = [a.name for a in arms if a.name != CONTROLLER]
    oracle_phases = {}
    for phase in phases:
        best = max(static, key=lambda n: per_arm[n]["phases"][phase.name]["goodput_tokens_per_s"])
        oracle_phases[phase.name] = {"arm": best, **per_arm[best]["phases"][phase.name]}
    oracle_goodput = sum(oracle_phases[p.name]["goodput_tokens_per_s"] * p.duration_s for p in phases) / sum(
        p.duration_s for p in phases)
    best_static = max(static, key=lambda n: per_arm[n]["overall"]["goodput_tokens_per_s"])
    ctl = per_arm[CONTROLLER]
    controller_arm = next(a for a in arms if a.name == CONTROLLER)
    plain_low = per_arm["plain"]["phases"][LOW_ACCEPTANCE_PHASE]["goodput_tokens_per_s"]

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else 0.0
    values = {"oracle_ratio": ratio(ctl["overall"]["goodput_tokens_per_s"], oracle_goodput),
              "best_static_ratio": ratio(ctl["overall"]["goodput_tokens_per_s"],
                                         per_arm[best_static]["overall"]["goodput_tokens_per_s"]),
              "low_acceptance_vs_plain": ratio(ctl["phases"][LOW_ACCEPTANCE_PHASE]["goodput_tokens_per_s"], plain_low)}
    names = {"oracle_ratio": "controller / per-phase oracle goodput",
             "best_static_ratio": f"controller / best single static ({best_static}) goodput",
             "low_acceptance_vs_plain": f"controller / plain goodput in {LOW_ACCEPTANCE_PHASE}"}
    return {
        "benchmark": "controller", "command": report.command("governor bench controller", args),
        "machine": report.machine(), "policy": args.policy,
        "phases": [p.model_dump() for p in phases],
        "goodput_definition": "output tokens of requests with TTFT <= slo.ttft_p99_seconds and mean inter-token "
                              "gap <= slo.inter_token_p99_seconds, per second of phase",
        "arms": per_arm,
        "oracle": {"phases": oracle_phases, "overall_goodput_tokens_per_s": oracle_goodput},
        "best_static": best_static,
        "controller": {"config_changes": len(controller_arm.applies), "applies": controller_arm.applies,
                       "retune": _retune_seconds(controller_arm, phases),
                       "decisions": [d for d in controller_arm.decisions if d["action"] != "no_data"],
                       "predicted_vs_measured": [
                           {k: d[k] for k in ("time", "action", "reason", "predicted_gain", "measured_gain")}
                           for d in controller_arm.decisions if d["measured_gain"] is not None]},
        "targets": {key: {"name": names[key], "value": values[key], "target": TARGETS[key],
                          "met": values[key] >= TARGETS[key]} for key in TARGETS},
    }


def _table(data: dict) -> str:
    phases = [p["name"] for p in data["phases"]]
    rows = []
    for name, arm in data["arms"].items():
        cells = [f"{arm['phases'][p]['goodput_tokens_per_s']:.1f}" for p in phases]
        itl = arm["overall"]["itl_p99_s"]
        rows.append([name, *cells, f"{arm['overall']['goodput_tokens_per_s']:.1f}",
                     "-" if itl is None else f"{itl * 1000:.0f}"])
    oracle = data["oracle"]
    rows.append(["oracle", *[f"{oracle['phases'][p]['goodput_tokens_per_s']:.1f} ({oracle['phases'][p]['arm']})"
                             for p in phases], f"{oracle['overall_goodput_tokens_per_s']:.1f}", "-"])
    return report.table(["arm", *[f"{p} goodput tok/s" for p in phases], "overall", "p99 ITL ms"], rows)


def _figure(arms: list[Arm], phases: list[Phase], policy: Policy):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 5))
    axes = figure.subplots()
    start, total = 0.0, sum(p.duration_s for p in phases)
    for i, phase in enumerate(phases):
        axes.axvspan(start, start + phase.duration_s, color=f"C{i}", alpha=0.08)
        axes.text(start + 0.5, 0.01, phase.name, fontsize=8, va="bottom", transform=axes.get_xaxis_transform())
        start += phase.duration_s
    edges = np.arange(0, total + BIN_SECONDS, BIN_SECONDS)
    for arm in arms:
        done = [(r.sent_s + r.e2e_s, r.output_tokens) for r in arm.result.records if _good(r, policy)]
        tokens, _ = np.histogram([t for t, _ in done], bins=edges, weights=[n for _, n in done])
        style = {"linewidth": 2.5, "color": "black"} if arm.name == CONTROLLER else {"linewidth": 1, "alpha": 0.8}
        axes.plot(edges[:-1] + BIN_SECONDS / 2, tokens / BIN_SECONDS, label=arm.name, **style)
    axes.set_ylim(bottom=0)
    top = axes.get_ylim()[1]
    for apply in next(a for a in arms if a.name == CONTROLLER).applies:
        axes.axvline(apply["time"], color="black", linestyle=":", linewidth=0.8)
        axes.text(apply["time"], top * 0.98, apply["config"], rotation=90, fontsize=6, va="top")
    axes.set_xlabel("seconds into the run (dotted: the controller applies a config)")
    axes.set_ylabel("goodput, tokens/s (SLO met)")
    axes.set_title("governor bench controller: phase-shifting load, controller vs static configs")
    axes.legend(fontsize=8, loc="upper right")
    return figure
