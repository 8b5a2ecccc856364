"""`governor bench controller`: can the controller adapt? It against static configs and the per-phase oracle.

The workload (governor/bench/adaptation_workload.py) runs phases whose best config differs, with closed-loop
clients. Each arm (plain decoding, the model's drafter at k = 2, 4 and 8, and the controller starting from the
model's default config, as `governor serve` would) serves the whole workload on a fresh engine; the per-phase
oracle is the best static arm in each phase of the same repetition. Production load recurs (the same tenants, the
same hours), and what the controller learns (k per batch band, the drafter, its calibration) is meant to be reused:
so the controller serves the workload --passes times in a row, keeping what it learned, and is measured on the
last pass; its first pass, from nothing learned, is reported beside it (controller_first_pass_vs_oracle).
The whole run is repeated (--repetitions, >= 3 for the full run) with the arm order rotated each time (a Latin
square: every arm runs in every position), and each ratio is reported as its mean over the repetitions with a 95 %
Student-t interval. The latency bounds (the controller's SLO and goodput's) are scaled by how much slower than the
reference machine this one serves the prose-hot phase with plain decoding, so that a slow machine is not tested at
the SLO's edge (--slo-scale). Writes controller.json (summary, per repetition figures, the controller's decisions
and its calibration) and controller.png (goodput per arm over time, and the config the controller had in use).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from controller.plane import build_control_plane
from controller.strategy import PROBES
from engine.engine import Engine
from governor.bench import report
from governor.bench.adaptation_workload import LOW_ACCEPTANCE_PHASE, RunResult, goodput, phases, run_closed_loop
from governor.bench.controller_timeline import RecordingClient, figure
from governor.control_cli import policy_or_none
from governor.loaders import load_models
from governor.registry import SHIPPED_NAMES, SMOLLM2
from policies import Policy
from seam import EngineConfig

NAME = "controller"
HELP = "the controller vs static configs and the per-phase oracle on phases that need different configs"
PLAIN = "plain"
STATIC_KS = (2, 4, 8)
CONTROLLER = "controller"
KEPT = ("keep", "fallback", "reenable")
TRIAL_ENDS = (*KEPT, "revert", "cut_short")
REFERENCE_PROSE_TOKENS_PER_SECOND = 174.6   # plain decoding in prose-hot on the machine the workload was sized on
                                            # (2026-12-04, commit 290263b: the mean of 3 repetitions, README),
                                            # its answers then as long as the other phases' (PROSE_LENGTH 1)
SPEED_PROBE_WARM_UP_SECONDS = 4.0
MAX_SLO_SCALE = 100.0
TARGETS = {"oracle_vs_best_static": 1.15, "controller_vs_oracle": 0.95, "controller_vs_best_static": 1.10,
           "low_acceptance_phase_vs_plain": 0.98}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2 s phases, two static arms, 2 repetitions (under 2 minutes)")
    parser.add_argument("--model", choices=SHIPPED_NAMES, default=SMOLLM2,
                        help="the target; its default drafter is the static arms' (SmolLM2: prompt lookup, as it "
                             "copies from its prompt)")
    parser.add_argument("--phase-seconds", type=float, default=20.0,
                        help="mean length of the four phases (copy and prose-hot one and a half of it, code and "
                             "mixed half)")
    parser.add_argument("--repetitions", type=report.int_in(1, 20), default=3,
                        help="whole runs, the arm order rotated each time")
    parser.add_argument("--passes", type=report.int_in(1, 10), default=2,
                        help="times the controller serves the workload in a row (it keeps what it learned); "
                             "goodput is the last pass's")
    parser.add_argument("--max-tokens", type=report.int_in(1, 128), default=48)
    parser.add_argument("--policy", default="responsive", help="the controller's policy file or shipped name")
    parser.add_argument("--slo-scale", type=_slo_scale, default=None, metavar="auto|X",
                        help="multiply the policy's latency bounds (the controller's and goodput's) by X; auto "
                             "(default): by how much slower than the reference machine this one serves prose-hot "
                             "with plain decoding (at least 1), so that every machine is tested in the same regime")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for controller.json/.png")


def run(args: argparse.Namespace) -> int:
    policy = policy_or_none(args.policy, "governor bench controller: --policy")
    if policy is None:
        return 2
    if args.quick:
        args.phase_seconds, args.max_tokens = min(args.phase_seconds, 2.0), min(args.max_tokens, 4)
        args.repetitions = min(args.repetitions, 2)
    models = load_models(args.model, device=torch.device("cpu"), dtype=torch.float32)
    specs = phases(models.tokenizer, args.phase_seconds, args.max_tokens)
    speed = _machine_speed(models, specs, min(SPEED_PROBE_WARM_UP_SECONDS, args.phase_seconds))
    args.slo_scale = args.slo_scale or auto_slo_scale(speed)
    policy = scaled_slo(policy, args.slo_scale)
    report.progress(f"plain decoding serves prose-hot at {speed:.1f} tok/s here: latency bounds x{args.slo_scale:.2f}")
    static = static_arms(models.spec_method, STATIC_KS[-1:] if args.quick else STATIC_KS)
    names = [*static, CONTROLLER]
    repetitions = []
    for rep in range(args.repetitions):
        order = names[rep % len(names):] + names[:rep % len(names)]          # a Latin square over the runs
        arms = {}
        for position, name in enumerate(order):
            report.progress(f"repetition {rep + 1}/{args.repetitions}, arm {position + 1}/{len(order)}: {name}")
            arms[name] = _run_arm(static.get(name), models, specs, policy, args.passes)
        repetitions.append({"order": order, "arms": arms})
    data = _report(repetitions, specs, policy, args)
    data["slo"] = {"scale": args.slo_scale, "plain_prose_tokens_per_second": speed,
                   "reference_prose_tokens_per_second": REFERENCE_PROSE_TOKENS_PER_SECOND,
                   "inter_token_p99_seconds": policy.slo.inter_token_p99_seconds,
                   "ttft_p99_seconds": policy.slo.ttft_p99_seconds}
    verdicts = [f"{key}: {s['mean']:.3f} (95% CI {s['ci95'][0]:.3f}-{s['ci95'][1]:.3f}) vs {TARGETS[key]:.2f} -> "
                f"{'met' if s['mean'] >= TARGETS[key] else 'NOT met'}" for key, s in data["summary"].items()
                if key in TARGETS]
    first = repetitions[0]["arms"]
    report.write_results(args.out, "controller", data, figure(first, specs, policy, CONTROLLER),
                         "\n".join([_table(data), *verdicts]))
    return 0


def _slo_scale(text: str) -> float | None:
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto or a number in 1..{MAX_SLO_SCALE:g}, got {text!r}") from None
    if not 1.0 <= value <= MAX_SLO_SCALE:
        raise argparse.ArgumentTypeError(f"must be auto or in 1..{MAX_SLO_SCALE:g}, got {text}")
    return value


def auto_slo_scale(plain_prose_tokens_per_second: float) -> float:
    """How many times slower than the reference machine this one serves prose-hot: at least 1 (a faster machine
    keeps the policy's bounds), at most MAX_SLO_SCALE."""
    if plain_prose_tokens_per_second <= 0:
        return MAX_SLO_SCALE
    return min(MAX_SLO_SCALE, max(1.0, REFERENCE_PROSE_TOKENS_PER_SECOND / plain_prose_tokens_per_second))


def _machine_speed(models, specs, warm_up: float) -> float:
    """Tokens per second plain decoding delivers in a whole prose-hot phase (its concurrency, requests and length)
    on this machine, measured as the reference was (goodput of a phase: finished requests replaced, their prefills
    included), after warm_up seconds of the same phase, which hold the process's first forwards. Counting only a
    few seconds of steady decoding read 52 tok/s where the phases then served 28-30."""
    prose = next(s for s in specs if s.name == LOW_ACCEPTANCE_PHASE)
    engine = Engine(models.target, models.tokenizer, models.draft, static_arms(models.spec_method, ())[PLAIN])
    result = run_closed_loop(engine, [dataclasses.replace(prose, seconds=warm_up + prose.seconds)])
    delivered = sum(n for record in result.records for at, n in record.deliveries if at >= warm_up)
    return delivered / prose.seconds


def scaled_slo(policy: Policy, scale: float) -> Policy:
    """policy with its latency bounds multiplied by scale: on a machine N times slower, the same workload at the same
    concurrency takes N times as long per token, and unscaled bounds would test where requests fall off the SLO
    rather than the configs (on a machine 3x slower, one arm measured 1.7-44.8 tok/s in prose-hot across runs)."""
    slo = policy.slo
    return policy.model_copy(update={"slo": slo.model_copy(update={
        field: getattr(slo, field) * scale for field in ("inter_token_p99_seconds", "ttft_p99_seconds")
        if getattr(slo, field) is not None})})


def static_arms(spec_method: str, ks: tuple[int, ...]) -> dict[str, EngineConfig]:
    """Plain decoding and the model's drafter at each k."""
    return {PLAIN: EngineConfig(spec_method="off", draft_len=0),
            **{f"{spec_method} k={k}": EngineConfig(spec_method=spec_method, draft_len=k) for k in ks}}


def _run_arm(config: EngineConfig | None, models, specs, policy: Policy, passes: int) -> dict:
    """A static config, or (None) the controller starting from the model's default config and serving the workload
    passes times: its result is the last pass's, its first_pass the first's."""
    engine = Engine(models.target, models.tokenizer, models.draft,
                    config or EngineConfig(spec_method=models.spec_method))
    if config is not None:
        return {"result": run_closed_loop(engine, specs)}
    client = RecordingClient(engine)
    with tempfile.TemporaryDirectory() as folder:
        plane = build_control_plane(client, policy, f"sqlite:///{folder}/bench.db", None, policy_name="bench")
        controller = plane.controller
        client.applies.clear()                # the first-start apply re-labels the same knobs; not a change
        controller.start()
        try:
            results = [run_closed_loop(engine, specs) for _ in range(passes)]
        finally:
            controller.stop()
        decisions = list(reversed(controller.store.decisions(10_000)))
        checks = [check.__dict__ for check in controller.calibration.checks()]
    return {"result": results[-1], "first_pass": results[0], "applies": client.applies, "decisions": decisions,
            "checks": checks}


def _figures(arm: dict, specs, policy: Policy, result_key: str = "result") -> dict:
    result: RunResult = arm[result_key]
    per_phase = goodput(result, specs, policy.slo.ttft_p99_seconds, policy.slo.inter_token_p99_seconds)
    total = sum(spec.seconds for spec in specs)
    return {"phases": per_phase, "overall": sum(per_phase[s.name] * s.seconds for s in specs) / total,
            "requests": len(result.records), "finished": sum(r.finished is not None for r in result.records)}


def _ratios(figures: dict[str, dict], first_pass: dict, specs) -> dict:
    """figures: per arm, the controller's last pass; first_pass: the controller's first."""
    static = [name for name in figures if name != CONTROLLER]
    total = sum(spec.seconds for spec in specs)
    oracle_arms = {s.name: max(static, key=lambda n: figures[n]["phases"][s.name]) for s in specs}
    oracle = sum(figures[oracle_arms[s.name]]["phases"][s.name] * s.seconds for s in specs) / total
    best_static = max(static, key=lambda n: figures[n]["overall"])
    ctl = figures[CONTROLLER]
    low = figures[PLAIN]["phases"][LOW_ACCEPTANCE_PHASE]
    return {"oracle_vs_best_static": _ratio(oracle, figures[best_static]["overall"]),
            "controller_vs_oracle": _ratio(ctl["overall"], oracle),
            "controller_vs_best_static": _ratio(ctl["overall"], figures[best_static]["overall"]),
            "low_acceptance_phase_vs_plain": _ratio(ctl["phases"][LOW_ACCEPTANCE_PHASE], low),
            "controller_first_pass_vs_oracle": _ratio(first_pass["overall"], oracle),
            "oracle_arms": oracle_arms, "oracle_goodput": oracle, "best_static": best_static}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _mean_ci(values: list[float]) -> dict:
    mean = float(np.mean(values))
    if len(values) < 2 or np.std(values) == 0:
        return {"mean": mean, "ci95": [mean, mean], "values": values}
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    return {"mean": mean, "ci95": [float(low), float(high)], "values": values}


def _calibration(repetitions: list[dict]) -> dict:
    """Over every trial of every controller run: the calibrated what-if against the switchback measurements (probes
    of the other mode included: they check the model's prediction of it), and the share of trials kept, of all
    (probes of the other mode and of an untried drafter included) and of those proposed on a calibrated prediction
    that they pay."""
    checks = [c for rep in repetitions for c in rep["arms"][CONTROLLER]["checks"]]
    decisions = [d for rep in repetitions for d in rep["arms"][CONTROLLER]["decisions"]]
    trials = [d for d in decisions if d["action"] == "trial"]
    kept = [d for d in decisions if d["action"] in KEPT]
    ended = [d for d in decisions if d["action"] in TRIAL_ENDS and d["predicted_gain"] is not None
             and d["inputs"]["kind"] not in PROBES]
    ended_kept = sum(d["action"] in KEPT for d in ended)

    def errors(field: str) -> dict:
        if not checks:
            return {"median_abs_error": None, "over_predicted_share": None}
        return {"median_abs_error": statistics.median(abs(c["measured"] / c[field] - 1) for c in checks),
                "over_predicted_share": sum(c[field] > c["measured"] for c in checks) / len(checks)}
    return {"predicted_trials": len(checks), "calibrated": errors("predicted"), "uncalibrated": errors("raw"),
            "trials_proposed": len(trials), "trials_kept": len(kept),
            "kept_share": len(kept) / len(trials) if trials else None,
            "predicted_trials_ended": len(ended), "predicted_trials_kept": ended_kept,
            "predicted_kept_share": ended_kept / len(ended) if ended else None,
            "checks": checks}


def _report(repetitions: list[dict], specs, policy: Policy, args: argparse.Namespace) -> dict:
    runs = []
    for rep in repetitions:
        figures = {name: _figures(arm, specs, policy) for name, arm in rep["arms"].items()}
        ctl = rep["arms"][CONTROLLER]
        first_pass = _figures(ctl, specs, policy, "first_pass")
        runs.append({"order": rep["order"], "arms": figures, "controller_first_pass": first_pass,
                     "ratios": _ratios(figures, first_pass, specs),
                     "controller": {"config_changes": len(ctl["applies"]), "applies": ctl["applies"],
                                    "decisions": [_decision(d, ctl["result"]) for d in ctl["decisions"]
                                                  if d["action"] != "no_data"]}})
    summary = {key: _mean_ci([run["ratios"][key] for run in runs])
               for key in [*TARGETS, "controller_first_pass_vs_oracle"]}
    return {
        "benchmark": "controller", "command": report.command("governor bench controller", args), "model": args.model,
        "machine": report.machine(), "policy": args.policy,
        "phases": [{"name": s.name, "concurrency": s.concurrency, "seconds": s.seconds, "requests_kinds":
                    sorted({job.kind for job in s.jobs})} for s in specs],
        "goodput_definition": "output tokens delivered during the phase by requests with TTFT <= "
                              "slo.ttft_p99_seconds and mean inter-token gap <= slo.inter_token_p99_seconds (the "
                              "policy's bounds x slo.scale, below), per second of phase; closed-loop clients; the "
                              "controller's on the last of its passes",
        "controller_passes": args.passes,
        "summary": {**summary, "repetitions": len(runs)},
        "targets": {key: {"target": value, "met": summary[key]["mean"] >= value} for key, value in TARGETS.items()},
        "calibration": _calibration(repetitions),
        "repetitions": runs,
    }


def _decision(row: dict, result: RunResult) -> dict:
    """A decision, placed in seconds into the measured (last) pass; negative: an earlier pass (the store's
    timestamps are UTC)."""
    at = dt.datetime.fromisoformat(str(row["at"]).replace("Z", "+00:00"))
    at = at if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)
    return {"seconds": round(at.timestamp() - result.started_at, 2), "action": row["action"], "reason": row["reason"],
            "predicted_gain": row["predicted_gain"], "measured_gain": row["measured_gain"],
            "config_version": row["config_version"]}


def _table(data: dict) -> str:
    phase_names = [p["name"] for p in data["phases"]]
    rows = []
    for number, run in enumerate(data["repetitions"], 1):
        for name, arm in run["arms"].items():
            rows.append([str(number), name, *[f"{arm['phases'][p]:.1f}" for p in phase_names], f"{arm['overall']:.1f}"])
        first = run["controller_first_pass"]
        rows.append([str(number), "controller, first pass", *[f"{first['phases'][p]:.1f}" for p in phase_names],
                     f"{first['overall']:.1f}"])
        rows.append([str(number), "oracle", *[run["ratios"]["oracle_arms"][p] for p in phase_names],
                     f"{run['ratios']['oracle_goodput']:.1f}"])
    return report.table(["rep", "arm", *[f"{p} tok/s" for p in phase_names], "overall"], rows)
