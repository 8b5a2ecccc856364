"""`governor bench telemetry`: what Prometheus metrics and OpenTelemetry tracing cost in tokens/s.

Two services over the same loaded weights and config serve the same concurrent requests: one with telemetry off
(the Window only, as always), one with EngineMetrics, step spans and a span per request exported through the SDK's
batch processor to an in-memory exporter, plus one /metrics exposition per repetition. Repetitions interleave (the
order alternates), so drifting machine load hits both alike. Writes telemetry.json and telemetry.png.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from engine.engine import Engine
from engine.factory import LoadedModels
from engine.runtime.limits import EngineLimits
from engine.server.service import EngineService
from engine.server.tracing import STEPS_PER_SPAN, StepSpans, traced_request
from engine.telemetry.metrics import EngineMetrics
from governor.bench import report
from governor.loaders import load_models, pick_device
from governor.loadgen import prompt_set
from governor.registry import DEFAULT_MODEL
from seam import EngineConfig, SamplingParams

NAME = "telemetry"
HELP = "tokens/s with Prometheus metrics and tracing on vs off"
TARGET_RATIO = 0.97
FULL = {"repetitions": 8, "prompts": 16, "max_tokens": 64}
QUICK = {"repetitions": 2, "prompts": 2, "max_tokens": 16}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model to serve (default {DEFAULT_MODEL})")
    parser.add_argument("--repetitions", type=report.int_in(1, 100_000),
                        help="interleaved pairs of runs (default 8; 2 quick)")
    parser.add_argument("--prompts", type=report.int_in(1, 100_000),
                        help="requests served at once per run (default 16; 2 quick)")
    parser.add_argument("--max-tokens", type=report.int_in(1, 100_000),
                        help="tokens generated per request (default 64; 16 quick)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"),
                        help="folder for telemetry.json and telemetry.png")
    parser.add_argument("--quick", action="store_true", help="few short runs: a smoke run")


@dataclass
class Arm:
    """One side of the comparison: a running service and what its telemetry needs per request."""
    name: str
    service: EngineService
    metrics: EngineMetrics | None = None
    tracer_provider: object | None = None
    exporter: object | None = None

    @property
    def tracer(self):
        return None if self.tracer_provider is None else self.tracer_provider.get_tracer("governor-bench")

    def close(self) -> None:
        self.service.stop()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()

    async def serve(self, prompts: list[list[int]], params: SamplingParams) -> int:
        tracer = self.tracer

        async def one(prompt: list[int]) -> int:
            stream = self.service.generate(prompt, params)
            if tracer is not None:
                stream = traced_request(tracer, stream, chat=False, model="bench", response_id="bench",
                                        params=params, prompt_tokens=len(prompt))
            last = None
            async for last in stream:
                pass
            return last.output_tokens

        tokens = sum(await asyncio.gather(*(one(p) for p in prompts)))
        if self.metrics is not None:
            self.metrics.exposition()
        return tokens


def run(args: argparse.Namespace) -> int:
    for name, default in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    started, machine = time.perf_counter(), report.machine()
    device, dtype = pick_device()
    report.progress(f"loading {args.model} on {device} ...")
    models = load_models(args.model, device=device, dtype=dtype)
    prompts = [models.tokenizer.encode(p.text) for p in prompt_set("code", args.prompts, seed=0, max_bytes=200)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    off, on = _arm_off(models), _arm_on(models)
    runs: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for arm in (off, on):
            asyncio.run(arm.serve(prompts[:1], params))
        for rep in range(args.repetitions):
            for arm in (off, on) if rep % 2 == 0 else (on, off):
                began = time.perf_counter()
                tokens = asyncio.run(arm.serve(prompts, params))
                runs[arm.name].append(tokens / (time.perf_counter() - began))
                if arm.exporter is not None:
                    arm.exporter.clear()
            report.progress(f"repetition {rep + 1}/{args.repetitions}: off {runs['off'][-1]:.1f} tok/s, "
                            f"on {runs['on'][-1]:.1f} tok/s, ratio {runs['on'][-1] / runs['off'][-1]:.3f}")
    finally:
        off.close()
        on.close()
    data = _results(args, machine, str(device), str(dtype).removeprefix("torch."), runs)
    data["wall_seconds"] = time.perf_counter() - started
    report.write_results(args.out, "telemetry", data, _figure(data),
                         f"telemetry on / off: {data['ratio']:.3f} (median of {args.repetitions} pairs; target >= "
                         f"{TARGET_RATIO}: {'met' if data['target_met'] else 'NOT met'})")
    return 0


def _engine(models: LoadedModels, sinks=()) -> Engine:
    spec_method = "draft_model" if models.draft is not None else "ngram"
    return Engine(models.target, models.tokenizer, models.draft, EngineConfig(spec_method=spec_method),
                  EngineLimits(), sinks)


def _arm_off(models: LoadedModels) -> Arm:
    service = EngineService(_engine(models))
    service.start()
    return Arm("off", service)


def _arm_on(models: LoadedModels) -> Arm:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    metrics = EngineMetrics(models.name)
    engine = _engine(models, [metrics, StepSpans(provider.get_tracer("governor-bench"))])
    metrics.watch_load(lambda: len(engine.scheduler.running), lambda: len(engine.scheduler.waiting))
    service = EngineService(engine)
    service.start()
    return Arm("on", service, metrics, provider, exporter)


def _results(args, machine: dict, device: str, dtype: str, runs: dict[str, list[float]]) -> dict:
    pairs = [on / off for on, off in zip(runs["on"], runs["off"])]
    ratio = statistics.median(pairs)
    return {
        "benchmark": "telemetry",
        "command": report.command("governor bench telemetry", args),
        "machine": {**machine, "load_average_at_end": report.load_average()},
        "settings": {"model": args.model, "repetitions": args.repetitions, "prompts": args.prompts,
                     "max_tokens": args.max_tokens, "device": device, "dtype": dtype, "greedy": True,
                     "steps_per_step_span": STEPS_PER_SPAN},
        "notes": {"off": "Window accumulation only (always on: the controller reads it)",
                  "on": "plus Prometheus metrics, a span per request and every 100th step, BatchSpanProcessor "
                        "to an in-memory exporter, one /metrics exposition per run",
                  "ratio": "median over repetitions of tokens/s on / tokens/s off in the same repetition"},
        "tokens_per_second": {name: values for name, values in runs.items()},
        "median_tokens_per_second": {name: statistics.median(values) for name, values in runs.items()},
        "pair_ratios": pairs,
        "ratio": ratio,
        "targets": [{"name": f"telemetry on / off >= {TARGET_RATIO}", "value": ratio, "threshold": TARGET_RATIO,
                     "met": ratio >= TARGET_RATIO}],
        "target_met": ratio >= TARGET_RATIO,
    }


def _figure(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4))
    throughput, ratios = figure.subplots(1, 2)
    reps = range(1, len(data["pair_ratios"]) + 1)
    for name, marker in (("off", "o-"), ("on", "s-")):
        throughput.plot(reps, data["tokens_per_second"][name], marker, label=f"telemetry {name}")
    throughput.set(title=f"{data['settings']['model']}: tokens/s per repetition", xlabel="repetition",
                   ylabel="tokens/s")
    throughput.set_ylim(bottom=0)
    throughput.set_xticks(list(reps))
    throughput.legend()
    ratios.bar(reps, data["pair_ratios"], color="C2")
    ratios.set_xticks(list(reps))
    ratios.axhline(TARGET_RATIO, color="C3", linestyle="--", label=f"target {TARGET_RATIO}")
    ratios.axhline(data["ratio"], color="gray", linestyle=":", label=f"median {data['ratio']:.3f}")
    ratios.set(title="telemetry on / off, same repetition", xlabel="repetition", ylabel="ratio",
               ylim=(min(0.8, min(data["pair_ratios"]) - 0.02), max(1.1, max(data["pair_ratios"]) + 0.02)))
    ratios.legend(fontsize=8)
    figure.suptitle(f"telemetry overhead on {data['settings']['device']}")
    return figure
