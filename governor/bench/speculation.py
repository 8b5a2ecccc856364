"""`governor bench spec`: speculative decoding at draft length k = 0..k_max, beside Hugging Face transformers.

Per model and drafter, at batch 1 (greedy, fixed output length): tokens/s, acceptance per draft position, the
draft/target cost ratio c, the target's forward time per step as k grows, and the measured speed-up beside
Leviathan et al.'s prediction from the measured acceptance and cost. Peers run in the same process on the same
weights: transformers `generate`, and assisted generation (draft model) or prompt lookup (n-gram). Then all
concurrency prompts at once against transformers serving them one by one. Writes spec.json and spec.png.

Here: the runs and Leviathan's maths; the transformers peer is in speculation_hf.py, the figure and summary in
speculation_report.py.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.engine import Engine
from engine.factory import LoadedModels, build_engine
from governor.bench import report
from governor.bench.speculation_hf import WARM_UP_TOKENS, hf_models, hf_peer, hf_tokens_per_second
from governor.bench.speculation_report import figure, point_line, summary
from governor.loaders import load_models, pick_device
from governor.loadgen import prompt_set
from governor.registry import DEFAULT_MODEL, SMOLLM2
from seam import MAX_DRAFT_LEN, EngineConfig, SamplingParams

NAME = "spec"
HELP = "speculative decoding: k = 0..8, beside transformers"
PLAIN = EngineConfig(spec_method="off", draft_len=0)
QUICK_PROMPTS, QUICK_MAX_TOKENS = 2, 16
NOTES = {
    "acceptance_rate": "accepted / drafted tokens (vLLM's definition)",
    "acceptance_per_position": "drafts accepted through position j / drafts reaching position j",
    "mean_acceptance_length": "1 + accepted tokens / drafts verified (vLLM's definition)",
    "alpha": "Leviathan's per-token acceptance: the alpha at which (1 - alpha^(k+1)) / (1 - alpha) equals the "
             "measured tokens per decode step, 1 + accepted / decode steps (steps an n-gram drafter found "
             "nothing to propose count as drafts of which none were accepted)",
    "cost_ratio": "draft forward seconds / (decode steps x k), divided by the target's forward seconds per decode "
                  "step at k = 0",
    "predicted_speedup": "(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)): Leviathan et al., target cost flat in k",
    "predicted_speedup_measured_target_cost": "the same with the target's measured cost at k: "
                                              "E / (k c + target_cost_growth)",
    "tokens_per_second": "emitted tokens / wall seconds of the whole run, prefill included; engine-internal "
                         "figures (forward seconds, steps, acceptance) cover decode steps only",
}


@dataclass(frozen=True)
class ModelPlan:
    methods: tuple[str, ...]
    prompt_kind: str
    prompts: int
    max_tokens: int


PLANS = {
    DEFAULT_MODEL: ModelPlan(("draft_model",), "code", prompts=16, max_tokens=128),
    SMOLLM2: ModelPlan(("ngram", "draft_model"), "chat", prompts=2, max_tokens=32),
}


@dataclass(frozen=True)
class Target:
    name: str
    key: str
    threshold: float


TARGETS = (
    Target("measured speed-up >= 0.9 x predicted at the best k", "speedup_over_predicted", 0.9),
    Target("ours >= 1.5 x the HF peer at batch 1", "over_peer", 1.5),
    Target("concurrent >= 6 x HF one by one", "concurrent_over_hf_one_by_one", 6.0),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", choices=list(PLANS), default=list(PLANS),
                        help="models to measure, each with its drafters (default: all)")
    parser.add_argument("--k-max", type=report.int_in(1, MAX_DRAFT_LEN), default=8, help="sweep k = 0..K (default 8)")
    parser.add_argument("--prompts", type=report.int_in(1, 10_000),
                        help="prompts per batch-1 run (default: " + _per_model("prompts") + f"; {QUICK_PROMPTS} quick)")
    parser.add_argument("--max-tokens", type=report.int_in(2, 4096),
                        help="tokens generated per prompt (default: " + _per_model("max_tokens")
                             + f"; {QUICK_MAX_TOKENS} quick)")
    parser.add_argument("--concurrency", type=report.int_in(1, 256), default=16,
                        help="requests submitted at once (default 16)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="folder for spec.json and spec.png")
    parser.add_argument("--quick", action="store_true", help="few prompts and tokens: a smoke run")


def _per_model(field: str) -> str:
    return ", ".join(f"{getattr(plan, field)} for {name}" for name, plan in PLANS.items())


def run(args: argparse.Namespace) -> int:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    started, machine = time.perf_counter(), report.machine()
    results = [_bench_model(name, args) for name in args.models]
    data = {
        "benchmark": "spec",
        "command": report.command("governor bench spec", args),
        "machine": {**machine, "load_average_at_end": report.load_average()},
        "settings": {"k_max": args.k_max, "concurrency": args.concurrency, "quick": args.quick,
                     "greedy": True, "ignore_eos": True, "device": str(pick_device()[0]),
                     "dtype": str(pick_device()[1]).removeprefix("torch.")},
        "notes": NOTES,
        "models": results,
        "targets": [target for result in results for drafter in result["drafters"] for target in drafter["targets"]],
        "wall_seconds": time.perf_counter() - started,
    }
    report.write_results(args.out, "spec", data, figure(results), summary(data))
    return 0


# -- one model --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelBench:
    """One model loaded into the engine and into transformers, with the prompts every run of it serves."""
    name: str
    draft: str | None
    engine: Engine
    hf_target: Any
    hf_draft: Any
    prompts: list[list[int]]
    crowd: list[list[int]]
    max_tokens: int


def _bench_model(name: str, args: argparse.Namespace) -> dict:
    plan = PLANS[name]
    bench = _load(name, args)
    plain = _serve_one_by_one(bench.engine, PLAIN, bench.prompts, bench.max_tokens)
    plain_point = _sweep_point(0, plain, plain)
    report.progress(point_line(name, "off", plain_point))
    sweeps = {method: [plain_point, *_sweep(bench, method, plain, args.k_max)] for method in plan.methods}
    hf_generate = hf_tokens_per_second(bench.hf_target, bench.prompts, bench.max_tokens)
    report.progress(f"{name}  HF generate  {hf_generate:8.1f} tok/s at batch 1")
    hf_one_by_one = hf_tokens_per_second(bench.hf_target, bench.crowd, bench.max_tokens)
    concurrent_plain = _serve_concurrently(bench.engine, PLAIN, bench.crowd, bench.max_tokens)
    report.progress(f"{name}  {len(bench.crowd)} requests: HF one by one {hf_one_by_one:.1f} tok/s, "
                    f"ours at once k=0 {concurrent_plain:.1f} tok/s")
    return {
        "model": name, "draft": bench.draft, "prompt_kind": plan.prompt_kind,
        "prompts": len(bench.prompts), "max_tokens": bench.max_tokens,
        "prompt_tokens_mean": statistics.mean(map(len, bench.prompts)),
        "hf_generate_tokens_per_second": hf_generate,
        "plain_over_hf_generate": plain.tokens_per_second / hf_generate,
        "concurrency": len(bench.crowd), "concurrent_plain_tokens_per_second": concurrent_plain,
        "hf_one_by_one_tokens_per_second": hf_one_by_one,
        "drafters": [_bench_drafter(bench, method, sweep, concurrent_plain, hf_one_by_one)
                     for method, sweep in sweeps.items()],
    }


def _load(name: str, args: argparse.Namespace) -> ModelBench:
    plan = PLANS[name]
    num_prompts = args.prompts or (QUICK_PROMPTS if args.quick else plan.prompts)
    max_tokens = args.max_tokens or (QUICK_MAX_TOKENS if args.quick else plan.max_tokens)
    report.progress(f"{name}: loading it into the engine and into transformers ...")
    models = load_models(name)
    hf_target, hf_draft = hf_models(models)
    return ModelBench(name, models.draft_name, build_engine(models, PLAIN), hf_target, hf_draft,
                      prompts=_prompt_ids(models, plan.prompt_kind, num_prompts),
                      crowd=_prompt_ids(models, plan.prompt_kind, args.concurrency), max_tokens=max_tokens)


def _sweep(bench: ModelBench, method: str, plain: Run, k_max: int) -> list[dict]:
    points = []
    for k in range(1, k_max + 1):
        run = _serve_one_by_one(bench.engine, EngineConfig(spec_method=method, draft_len=k), bench.prompts,
                                bench.max_tokens)
        points.append(_sweep_point(k, run, plain))
        report.progress(point_line(bench.name, method, points[-1]))
    return points


def _bench_drafter(bench: ModelBench, method: str, sweep: list[dict], concurrent_plain: float,
                   hf_one_by_one: float) -> dict:
    best = max(sweep[1:], key=lambda point: point["tokens_per_second"])
    peer = hf_peer(bench.name, bench.hf_target, bench.hf_draft, bench.prompts, bench.max_tokens, method, best["k"])
    concurrent = _serve_concurrently(bench.engine, EngineConfig(spec_method=method, draft_len=best["k"]), bench.crowd,
                                     bench.max_tokens)
    report.progress(f"{bench.name}  {method}  {len(bench.crowd)} requests at once, k={best['k']}: "
                    f"{concurrent:.1f} tok/s")
    figures = {
        "speedup_over_predicted": best["speedup_over_predicted"],
        "over_peer": best["tokens_per_second"] / peer["tokens_per_second"],
        "concurrent_over_hf_one_by_one": max(concurrent, concurrent_plain) / hf_one_by_one,
    }
    return {
        "method": method, "sweep": sweep, "best_k": best["k"], "peer": peer, **figures,
        "concurrent_tokens_per_second": concurrent,
        "targets": [_target_result(bench.name, method, target, figures[target.key]) for target in TARGETS],
    }


def _target_result(model: str, method: str, target: Target, value: float | None) -> dict:
    return {"model": model, "method": method, "target": target.name, "value": value,
            "threshold": target.threshold, "met": value is not None and value >= target.threshold}


def _prompt_ids(models: LoadedModels, kind: str, n: int) -> list[list[int]]:
    tokenizer = models.tokenizer
    return [tokenizer.encode(tokenizer.render_chat(prompt.body()["messages"]) if prompt.messages else prompt.text)
            for prompt in prompt_set(kind, n, seed=0)]


# -- our engine -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Prompts served one at a time: wall time over everything, engine figures over decode steps only."""
    wall_seconds: float
    outputs: list[list[int]]
    steps: int
    num_drafts: int
    target_seconds: float
    draft_seconds: float
    drafted_per_position: list[int]
    accepted_per_position: list[int]

    @property
    def tokens_per_second(self) -> float:
        return sum(map(len, self.outputs)) / self.wall_seconds

    @property
    def target_seconds_per_step(self) -> float:
        return self.target_seconds / self.steps


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _warm_up(engine: Engine, config: EngineConfig, prompts: list[list[int]]) -> None:
    engine.apply(config)
    for i, ids in enumerate(prompts):
        engine.add_request(f"warm-up-{i}", ids, _greedy(WARM_UP_TOKENS))
    while engine.has_work:
        engine.step()


def _serve_one_by_one(engine: Engine, config: EngineConfig, prompts: list[list[int]], max_tokens: int) -> Run:
    _warm_up(engine, config, prompts[:1])
    windows, outputs = [], []
    started = time.perf_counter()
    for i, ids in enumerate(prompts):
        seq = engine.add_request(f"one-{i}", ids, _greedy(max_tokens))
        while seq.num_output == 0:
            engine.step()
        engine.snapshot()
        while engine.has_work:
            engine.step()
        windows.append(engine.snapshot())
        outputs.append(seq.output_ids)
    wall = time.perf_counter() - started
    return Run(wall, outputs, steps=sum(w.steps for w in windows), num_drafts=sum(w.num_drafts for w in windows),
               target_seconds=sum(w.target_forward_seconds for w in windows),
               draft_seconds=sum(w.draft_forward_seconds for w in windows),
               drafted_per_position=_sum_positions([w.drafted_per_position for w in windows]),
               accepted_per_position=_sum_positions([w.accepted_per_position for w in windows]))


def _sum_positions(counts: list[list[int]]) -> list[int]:
    return [sum(c[j] for c in counts if j < len(c)) for j in range(max(map(len, counts)))]


def _serve_concurrently(engine: Engine, config: EngineConfig, prompts: list[list[int]], max_tokens: int) -> float:
    _warm_up(engine, config, prompts)
    started = time.perf_counter()
    seqs = [engine.add_request(f"crowd-{i}", ids, _greedy(max_tokens)) for i, ids in enumerate(prompts)]
    while engine.has_work:
        engine.step()
    return sum(seq.num_output for seq in seqs) / (time.perf_counter() - started)


# -- the figures of one k ---------------------------------------------------------------------------------------


def _sweep_point(k: int, run: Run, plain: Run) -> dict:
    growth = run.target_seconds_per_step / plain.target_seconds_per_step
    drafted, accepted = sum(run.drafted_per_position), sum(run.accepted_per_position)
    alpha = _leviathan_alpha(1 + accepted / run.steps, k) if k else None
    cost = run.draft_seconds / (run.steps * k) / plain.target_seconds_per_step if k else None
    expected = _expected_tokens_per_step(alpha, k) if k else None
    predicted = expected / (k * cost + 1) if k else None
    speedup = run.tokens_per_second / plain.tokens_per_second
    return {
        "k": k,
        "tokens_per_second": run.tokens_per_second,
        "speedup": speedup,
        "predicted_speedup": predicted,
        "speedup_over_predicted": speedup / predicted if k else None,
        "predicted_speedup_measured_target_cost": expected / (k * cost + growth) if k else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_per_position": [a / d for a, d in zip(run.accepted_per_position, run.drafted_per_position)],
        "mean_acceptance_length": 1 + accepted / run.num_drafts if run.num_drafts else None,
        "alpha": alpha,
        "cost_ratio": cost,
        "target_forward_seconds_per_step": run.target_seconds_per_step,
        "target_cost_growth": growth,
        "draft_forward_seconds_per_position": run.draft_seconds / (run.steps * k) if k else None,
        "decode_steps": run.steps,
        "emitted_tokens": sum(map(len, run.outputs)),
        "wall_seconds": run.wall_seconds,
        "matches_plain_output": statistics.fmean(a == b for a, b in zip(run.outputs, plain.outputs)),
    }


def _expected_tokens_per_step(alpha: float, k: int) -> float:
    return sum(alpha ** i for i in range(k + 1))


def _leviathan_alpha(tokens_per_step: float, k: int) -> float:
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if _expected_tokens_per_step(middle, k) < tokens_per_step else (low, middle)
    return (low + high) / 2
