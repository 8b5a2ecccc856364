"""`governor bench judge`: the old sequential judge and the switchback judge side by side on live traffic.

One engine (governor-moe on the CPU) serves loopback HTTP traffic while trials run against it in-process:
- A/A: the candidate is the incumbent's knobs under another version number;
- A/A under drift: the same while closed-loop clients ramp from 1 to 8 during each trial;
- A/B: the candidate's model forwards (target and draft) are slowed by 10% and by 25% of their own time, a
  bench-only fault (the product ships no slow-down knob).
Steady traffic comes from the load generator (Poisson arrivals of greedy code). The old judge holds one window of
the incumbent, then one of the candidate, and keeps the candidate if its tokens per busy second / the incumbent's
>= keep_gain (what the loop did before switchback trials); its time to decision is its one trial window. The
switchback judge runs an Experiment and decides with controller.trials.judge under the policy's judge settings;
"within 2 windows" counts its decisions within 2 of the policy's windows. A false change: for the switchback judge any
verdict of a difference (better or worse) in an A/A trial; for the old judge, keeping the candidate in an A/A trial (its
revert is the "no change" outcome). Detection: the slowed candidate is reverted (old) or judged worse (switchback).
Writes judge.json and judge.png.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import torch
from scipy import stats

from controller.trials.judge import BETTER, WORSE, SwitchbackJudge, same_tokens
from controller.window_stats import tokens_per_busy_second
from engine.engine import Engine
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from governor.bench import report
from governor.control_cli import policy_or_none
from governor.loaders import load_models
from governor.loadgen import Phase
from governor.loadgen.runner import run_forever
from policies import Policy
from seam import EngineConfig, Experiment

NAME = "judge"
HELP = "the old sequential judge vs the switchback judge: A/A false changes, detection of slowed candidates"
SCENARIOS = {"aa": 0.0, "aa_drift": 0.0, "ab_10pct": 0.10, "ab_25pct": 0.25}
INCUMBENT = EngineConfig(version=1, spec_method="draft_model", draft_len=4)
POLL_SECONDS = 0.25
MAX_DRIFT_CLIENTS = 8


@dataclass
class TrialResult:
    judge: str
    scenario: str
    outcome: str
    changed: bool         # the candidate kept (a config change)
    detected: bool        # a slowed candidate reverted / judged worse
    seconds: float
    effect: float | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smoke run under 3 minutes: 3 short trials per scenario")
    parser.add_argument("--trials", type=report.int_in(1, 10_000), default=100, help="trials per scenario and judge")
    parser.add_argument("--window-seconds", type=float, default=2.0, help="the old judge's window")
    parser.add_argument("--qps", type=float, default=3.0, help="load generator arrival rate (steady scenarios)")
    parser.add_argument("--max-tokens", type=report.int_in(1, 1024), default=64)
    parser.add_argument("--policy", default="default", help="policy whose judge settings and keep_gain are used")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for judge.json/.png")


def run(args: argparse.Namespace) -> int:
    policy = policy_or_none(args.policy, "governor bench judge: --policy")
    if policy is None:
        return 2
    if args.quick:       # shorter trials too: a look every 4 pairs, at most 32 blocks
        args.trials, args.window_seconds = min(args.trials, 3), min(args.window_seconds, 1.0)
        policy = policy.model_copy(update={"judge": policy.judge.model_copy(update={"min_samples": 4,
                                                                                    "max_blocks": 32})})
    models = load_models("governor-moe", device=torch.device("cpu"), dtype=torch.float32)
    engine = Engine(models.target, models.tokenizer, models.draft, INCUMBENT)
    slow = _inject_slowdown(engine)
    service = EngineService(engine)
    results: list[TrialResult] = []
    started = time.monotonic()
    with serving_in_thread(create_app(service, models.name, None), service) as url:
        runs = {"sequential": lambda c: _sequential_trial(engine, c, args.window_seconds, policy.trial.keep_gain),
                "switchback": lambda c: _switchback_trial(engine, c, policy)}
        for scenario, fraction in SCENARIOS.items():
            with _traffic(url, scenario, args) as new_trial:
                for judge, run in runs.items():
                    report.progress(f"{scenario}: {args.trials} trials of the {judge} judge "
                                    f"({time.monotonic() - started:.0f} s so far)")
                    for number in range(args.trials):
                        candidate = INCUMBENT.changed(version=100 + len(results))
                        slow.update(version=candidate.version, fraction=fraction)
                        new_trial()
                        outcome, seconds, effect = run(candidate)
                        results.append(_result(judge, scenario, outcome, seconds, effect))
    data = _report(results, policy, args, time.monotonic() - started)
    report.write_results(args.out, "judge", data, _figure(data, results), _table(data))
    return 0


# -- the bench-only fault ------------------------------------------------------------------------------------------


def _inject_slowdown(engine: Engine) -> dict:
    """While the engine runs the config with version slow['version'], each model forward sleeps slow['fraction'] of
    its own time."""
    slow = {"version": None, "fraction": 0.0}
    for model in filter(None, (engine.target, engine.model_drafter and engine.model_drafter.model)):
        forward = model.forward

        def slowed(*args, _forward=forward, **kwargs):
            began = time.perf_counter()
            out = _forward(*args, **kwargs)
            if slow["fraction"] and engine.config.version == slow["version"]:
                time.sleep(slow["fraction"] * (time.perf_counter() - began))
            return out
        model.forward = slowed
    return slow


# -- traffic -------------------------------------------------------------------------------------------------------


@contextmanager
def _traffic(url: str, scenario: str, args: argparse.Namespace):
    """Serve the scenario's traffic; yields a callable to call as each trial begins (restarts the drift ramp)."""
    stop = threading.Event()
    new_trial = lambda: None  # noqa: E731
    if scenario == "aa_drift":
        ramp = _RampingClients(url, args.max_tokens, stop)
        thread, new_trial = threading.Thread(target=ramp.run, daemon=True), ramp.reset
    else:
        phase = Phase(name="steady", duration_s=3600, qps=args.qps, prompts="code", temperature=0.0,
                      max_tokens=args.max_tokens, arrival="poisson")
        thread = threading.Thread(target=run_forever, args=(url, [phase], stop), daemon=True)
    thread.start()
    time.sleep(2.0)                        # let the queue reach its steady state
    try:
        yield new_trial
    finally:
        stop.set()
        thread.join(timeout=60)


class _RampingClients:
    """Closed-loop clients: 1 at each reset() (each trial), one more every step_seconds, up to 8."""

    def __init__(self, url: str, max_tokens: int, stop: threading.Event, step_seconds: float = 0.5):
        self.url, self.max_tokens, self.stop, self.step_seconds = url, max_tokens, stop, step_seconds
        self.started = time.monotonic()

    def reset(self) -> None:
        self.started = time.monotonic()

    def active(self) -> int:
        return min(MAX_DRIFT_CLIENTS, 1 + int((time.monotonic() - self.started) / self.step_seconds))

    def run(self) -> None:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(MAX_DRIFT_CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _client(self, number: int) -> None:
        body = {"model": "governor-moe", "prompt": "def fibonacci(n):\n    ", "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=120) as http:
            while not self.stop.is_set():
                if number >= self.active():
                    time.sleep(0.05)
                    continue
                http.post(f"{self.url}/v1/completions", json=body)


# -- the two judges ------------------------------------------------------------------------------------------------


def _sequential_trial(engine: Engine, candidate: EngineConfig, window: float,
                      keep_gain: float) -> tuple[str, float, float | None]:
    """The loop's judge before switchback trials: one window of the incumbent, then one of the candidate."""
    engine.snapshot()
    time.sleep(window)
    baseline = engine.snapshot()
    began = time.monotonic()
    engine.apply(candidate)
    time.sleep(window)
    trial = engine.snapshot()
    engine.apply(INCUMBENT)
    base = tokens_per_busy_second(baseline)
    gain = tokens_per_busy_second(trial) / base if base > 0 else None
    outcome = "kept" if gain is not None and gain >= keep_gain else "reverted"
    return outcome, time.monotonic() - began, gain


def _switchback_trial(engine: Engine, candidate: EngineConfig, policy: Policy) -> tuple[str, float, float | None]:
    judge = SwitchbackJudge(policy.judge, policy.trial.keep_gain, same_tokens=same_tokens(INCUMBENT, candidate))
    began = time.monotonic()
    engine.apply(Experiment(incumbent=INCUMBENT, candidate=candidate, block_steps=policy.judge.block_steps))
    engine.snapshot()
    while True:
        time.sleep(POLL_SECONDS)
        judge.add(engine.snapshot().blocks or ())
        verdict = judge.look()
        if verdict is not None and verdict.decided:
            engine.apply(INCUMBENT)
            effect = verdict.comparison.effect if verdict.comparison is not None else None
            return verdict.outcome, time.monotonic() - began, effect


def _result(judge: str, scenario: str, outcome: str, seconds: float, effect: float | None) -> TrialResult:
    if judge == "sequential":
        changed, detected = outcome == "kept", outcome == "reverted"
    else:
        changed, detected = outcome in (BETTER, WORSE), outcome == WORSE
    return TrialResult(judge, scenario, outcome, changed, detected, round(seconds, 3),
                       None if effect is None else round(effect, 4))


# -- figures -------------------------------------------------------------------------------------------------------


def _rate(hits: int, trials: int) -> dict:
    if not trials:
        return {"rate": None, "hits": 0, "trials": 0, "ci95": None}
    interval = stats.binomtest(hits, trials).proportion_ci(0.95, method="wilson")
    return {"rate": hits / trials, "hits": hits, "trials": trials, "ci95": [interval.low, interval.high]}


def _judge_figures(results: list[TrialResult], window_seconds: float) -> dict:
    def of(scenario: str) -> list[TrialResult]:
        return [r for r in results if r.scenario == scenario]

    def rate(scenario: str, pick: Callable[[TrialResult], bool]) -> dict:
        rows = of(scenario)
        return _rate(sum(map(pick, rows)), len(rows))
    details = {"aa_false_change": rate("aa", lambda r: r.changed),
               "aa_drift_false_change": rate("aa_drift", lambda r: r.changed),
               "detect_10pct": rate("ab_10pct", lambda r: r.detected),
               "detect_25pct": rate("ab_25pct", lambda r: r.detected),
               "detect_10pct_within_2_windows": rate("ab_10pct", lambda r: r.detected
                                                     and r.seconds <= 2 * window_seconds)}
    return {"aa_false_change_rate": details["aa_false_change"]["rate"],
            "aa_drift_false_change_rate": details["aa_drift_false_change"]["rate"],
            "detect_10pct": details["detect_10pct"]["rate"], "detect_25pct": details["detect_25pct"]["rate"],
            "detect_10pct_within_2_windows": details["detect_10pct_within_2_windows"]["rate"],
            "median_seconds_to_decision": statistics.median(r.seconds for r in results) if results else None,
            "median_seconds_to_decision_per_scenario": {s: statistics.median(r.seconds for r in of(s))
                                                        for s in SCENARIOS if of(s)},
            "trials": len(results), "rates_with_ci95": details,
            "outcomes": {s: {k: len(list(g)) for k, g in itertools.groupby(sorted(r.outcome for r in of(s)))}
                         for s in SCENARIOS}}


def _report(results: list[TrialResult], policy: Policy, args: argparse.Namespace, seconds: float) -> dict:
    judges = {}
    for name in ("sequential", "switchback"):
        unit = args.window_seconds if name == "sequential" else policy.window.seconds
        judges[name] = {**_judge_figures([r for r in results if r.judge == name], unit), "window_seconds": unit}
    return {"benchmark": "judge", "command": report.command("governor bench judge", args),
            "machine": report.machine(), "policy": args.policy, "judge_settings": policy.judge.model_dump(),
            "keep_gain": policy.trial.keep_gain, "wall_seconds": round(seconds, 1),
            "definitions": {"false_change": "A/A trial: switchback says better or worse; sequential keeps the "
                                            "candidate",
                            "detect": "slowed candidate: switchback says worse; sequential reverts it",
                            "slowdown": "each model forward of the candidate sleeps 10% / 25% of its own time "
                                        "(bench-only fault)",
                            "drift": "closed-loop clients ramp 1 -> 8 during each trial"},
            "judges": judges, "trials": [asdict(r) for r in results]}


def _table(data: dict) -> str:
    rows = []
    for name, figures in data["judges"].items():
        cells = [figures[key] for key in ("aa_false_change_rate", "aa_drift_false_change_rate", "detect_10pct",
                                          "detect_25pct", "detect_10pct_within_2_windows")]
        rows.append([name, *["-" if c is None else f"{c:.3f}" for c in cells],
                     f"{figures['median_seconds_to_decision']:.2f}", str(figures["trials"])])
    return report.table(["judge", "A/A false change", "A/A drift false change", "detect 10%", "detect 25%",
                         "10% within 2 windows", "median s to decision", "trials"], rows)


def _figure(data: dict, results: list[TrialResult]):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5))
    rates, times = figure.subplots(1, 2)
    keys = ["aa_false_change", "aa_drift_false_change", "detect_10pct", "detect_25pct"]
    for offset, (name, figures) in enumerate(data["judges"].items()):
        details = figures["rates_with_ci95"]
        values = [details[k]["rate"] or 0.0 for k in keys]
        errors = [[v - (details[k]["ci95"] or [v, v])[0] for k, v in zip(keys, values)],
                  [(details[k]["ci95"] or [v, v])[1] - v for k, v in zip(keys, values)]]
        rates.bar([i + offset * 0.4 for i in range(len(keys))], values, width=0.4, yerr=errors, label=name,
                  capsize=3)
    rates.set_xticks([i + 0.2 for i in range(len(keys))], ["A/A", "A/A drift", "detect 10%", "detect 25%"])
    rates.axhline(0.01, color="black", linestyle=":", linewidth=0.8)
    rates.axhline(0.95, color="black", linestyle=":", linewidth=0.8)
    rates.set_ylim(0, 1.05)
    rates.set_ylabel("share of trials (95% CI)")
    rates.legend(fontsize=8)
    rates.set_title("false changes (A/A) and detections (A/B)")
    for offset, name in enumerate(data["judges"]):
        for i, scenario in enumerate(SCENARIOS):
            seconds = [r.seconds for r in results if r.judge == name and r.scenario == scenario]
            times.scatter([i + offset * 0.3 + 0.05 * ((j % 5) - 2) for j in range(len(seconds))], seconds, s=8,
                          color=f"C{offset}", label=name if i == 0 else None)
    times.set_xticks([i + 0.15 for i in range(len(SCENARIOS))], list(SCENARIOS))
    times.set_ylabel("seconds to decision")
    times.set_title("time to decision per trial")
    times.legend(fontsize=8)
    figure.suptitle("governor bench judge: the old sequential judge vs the switchback judge, on live traffic")
    return figure
