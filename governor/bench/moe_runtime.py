"""`governor bench moe`: the MoE runtime on the shipped MoE model, one process beside expert parallelism.

All prompts are served at once (plain decoding, greedy, fixed output length), first in one process, then over
--ep ranks at each capacity factor: tokens/s, step time, the all-to-all share of step time, balancedness over
ranks and the drop rate. Then the stall of a live re-placement that moves every expert to another rank, and
balancedness before and after placing experts with the planner from the measured heat.
Writes moe.json and moe.png.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from controller.decide.planner import plan_placement
from engine.engine import Engine
from engine.factory import build_engine
from engine.runtime.limits import EngineLimits
from governor.bench import report
from governor.loaders import load_models
from governor.loadgen import prompt_set
from governor.registry import DEFAULT_MODEL
from seam import EngineConfig, SamplingParams, Window

PLAIN = EngineConfig(spec_method="off", draft_len=0)
CAPACITY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 0.0)
QUICK_PROMPTS, QUICK_MAX_TOKENS = 3, 8
REPLACEMENTS = 3
NOTES = {
    "tokens_per_second": "emitted tokens / wall seconds, all prompts submitted at once, prefill included",
    "comm_share": "all-to-all and all-gather seconds inside target forwards / step seconds (rank 0)",
    "balancedness": "vLLM: sum over layers of mean pairs per rank / sum over layers of max pairs per rank",
    "drop_rate": "(token, expert) pairs dropped over capacity / pairs routed",
    "replacement_seconds": "serving stalled while every expert moved to another rank (mean of the runs)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ep", type=report.int_in(2, 64), default=2, help="expert-parallel ranks (default 2)")
    parser.add_argument("--redundant-experts", type=report.int_in(0, 256), default=0,
                        help="spare slots for replicas, over all ranks (default 0)")
    parser.add_argument("--prompts", type=report.int_in(1, 256), help=f"prompts served at once (default 8; "
                                                                 f"{QUICK_PROMPTS} quick)")
    parser.add_argument("--max-tokens", type=report.int_in(1, 1024),
                        help=f"tokens generated per prompt (default 32; {QUICK_MAX_TOKENS} quick)")
    parser.add_argument("--capacity-factors", type=float, nargs="+", default=list(CAPACITY_FACTORS),
                        help="capacity factors to sweep, 0 = dropless (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="folder for moe.json and moe.png")
    parser.add_argument("--quick", action="store_true", help="few prompts and tokens: a smoke run")


def run(args: argparse.Namespace) -> int:
    for cf in args.capacity_factors:
        if not 0 <= cf <= 16:
            report.progress(f"governor bench moe: --capacity-factors: {cf} is outside 0..16")
            return 2
    started, machine = time.perf_counter(), report.machine()
    num_prompts = args.prompts or (QUICK_PROMPTS if args.quick else 8)
    max_tokens = args.max_tokens or (QUICK_MAX_TOKENS if args.quick else 32)
    report.progress(f"{DEFAULT_MODEL}: loading; {num_prompts} prompts x {max_tokens} tokens, EP=1 then EP={args.ep}")
    models = load_models(DEFAULT_MODEL, draft="none", device=torch.device("cpu"), dtype=torch.float32)
    prompts = [models.tokenizer.encode(p.text) for p in prompt_set("code", num_prompts, seed=0, max_bytes=400)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    limits = EngineLimits(kv_cache_tokens=max(1024, num_prompts * 1024))

    single = build_engine(models, PLAIN, limits)
    _serve(single, prompts[:1], params)  # warm-up
    one_process = _point(single, PLAIN, prompts, params)
    report.progress(_line("EP=1", one_process))

    # build_engine frees an expert-parallel target's own expert weights, so EP gets its own copy of the model
    parallel = build_engine(load_models(DEFAULT_MODEL, draft="none", device=torch.device("cpu"),
                                        dtype=torch.float32), PLAIN, limits, ep=args.ep,
                            redundant_experts=args.redundant_experts)
    try:
        _serve(parallel, prompts[:1], params)
        sweep = []
        for version, cf in enumerate(args.capacity_factors, start=1):
            sweep.append(_point(parallel, PLAIN.changed(capacity_factor=cf, version=version),
                                prompts, params))
            report.progress(_line(f"EP={args.ep}", sweep[-1]))
        dropless = next((p for p in sweep if p["capacity_factor"] == 0), None) or \
            _point(parallel, PLAIN.changed(version=100), prompts, params)
        stall = _replacement_stall(parallel, prompts, params)
        report.progress(f"re-placement (every expert to another rank): {stall['mean_seconds'] * 1e3:.1f} ms stall")
        placed = _placed(parallel, dropless, prompts, params)
    finally:
        parallel.close()

    data = {
        "benchmark": "moe",
        "command": report.command("governor bench moe", args),
        "machine": {**machine, "load_average_at_end": report.load_average()},
        "settings": {"model": DEFAULT_MODEL, "ep": args.ep, "redundant_experts": args.redundant_experts,
                     "prompts": num_prompts, "max_tokens": max_tokens,
                     "spec_method": "off", "greedy": True, "device": "cpu", "dtype": "float32",
                     "topology": vars(parallel.experts.topology)},
        "notes": NOTES,
        "one_process": one_process,
        "expert_parallel": sweep,
        "ep_over_one_process": dropless["tokens_per_second"] / one_process["tokens_per_second"],
        "replacement": stall,
        "placement": placed,
        "wall_seconds": time.perf_counter() - started,
    }
    report.write_results(args.out, "moe", data, _figure(data), _summary(data))
    return 0


def _serve(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> float:
    """Serve every prompt at once; wall seconds."""
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{i}", prompt, params)
    while engine.has_work:
        engine.step()
    return time.perf_counter() - started


def _point(engine: Engine, config: EngineConfig, prompts: list[list[int]], params: SamplingParams) -> dict:
    engine.apply(config)
    engine.step()  # adopts the config before the window opens
    engine.snapshot()
    seconds = _serve(engine, prompts, params)
    return _figures(engine.snapshot(), seconds)


def _figures(window: Window, seconds: float) -> dict:
    routed = sum(map(sum, window.expert_tokens))
    return {
        "capacity_factor": window.capacity_factor, "wall_seconds": seconds,
        "tokens_per_second": window.emitted_tokens / seconds, "steps": window.steps,
        "step_seconds_mean": window.step_seconds / max(window.steps, 1),
        "all_to_all_seconds": window.all_to_all_seconds, "comm_share": window.comm_share,
        "balancedness": window.balancedness, "balancedness_per_layer": window.balancedness_per_layer,
        "drop_rate": window.dropped_tokens / routed if routed else 0.0, "dropped_tokens": window.dropped_tokens,
        "rank_tokens": window.rank_tokens, "expert_tokens": window.expert_tokens,
    }


def _replacement_stall(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Move every slot's expert one device over, while requests are in flight; measure the stall each time."""
    topology = engine.experts.topology
    stalls = []
    for run in range(REPLACEMENTS):
        shifted = [phy2log[-topology.slots_per_device:] + phy2log[:-topology.slots_per_device]
                   for phy2log in engine.experts.placement]
        for i, prompt in enumerate(prompts):
            engine.add_request(f"moving-{run}-{i}", prompt, params)
        engine.step()
        engine.snapshot()
        engine.apply(engine.config.changed(placement=shifted, version=engine.config.version + 1))
        while engine.has_work:
            engine.step()
        stalls.append(engine.snapshot().replacement_seconds)
    block = engine.target.moe_blocks[0]
    slot_bytes = 3 * block.gate.in_features * engine.target.spec.intermediate_size * 4
    moved = sum(len(phy2log) for phy2log in engine.experts.placement) * slot_bytes
    return {"runs": stalls, "mean_seconds": float(np.mean(stalls)), "moved_bytes_per_run": moved}


def _placed(engine: Engine, dropless: dict, prompts, params) -> dict:
    heat = np.asarray(dropless["expert_tokens"], dtype=float)
    placement = plan_placement(heat, engine.experts.topology)
    after = _point(engine, engine.config.changed(placement=placement, capacity_factor=0.0,
                                                 version=engine.config.version + 1), prompts, params)
    report.progress(f"placement from measured heat: balancedness {dropless['balancedness']:.3f} -> "
                    f"{after['balancedness']:.3f}")
    return {"phy2log": placement, "before": dropless, "after": after}


def _line(name: str, point: dict) -> str:
    share = "-" if point["comm_share"] is None else f"{point['comm_share']:.1%}"
    return (f"{name}  cf={point['capacity_factor']:<5} {point['tokens_per_second']:7.1f} tok/s  "
            f"step {point['step_seconds_mean'] * 1e3:6.1f} ms  comm {share:>6}  "
            f"balancedness {point['balancedness']:.3f}  drop {point['drop_rate']:.1%}")


def _summary(data: dict) -> str:
    rows = [["1", "0", f"{data['one_process']['tokens_per_second']:.1f}",
             f"{data['one_process']['step_seconds_mean'] * 1e3:.1f}", "-", "-", "-"]]
    for p in data["expert_parallel"]:
        rows.append([str(data["settings"]["ep"]), f"{p['capacity_factor']:g}", f"{p['tokens_per_second']:.1f}",
                     f"{p['step_seconds_mean'] * 1e3:.1f}", f"{p['comm_share']:.1%}", f"{p['balancedness']:.3f}",
                     f"{p['drop_rate']:.1%}"])
    return report.table(["EP", "cf", "tok/s", "step ms", "comm", "balancedness", "drop"], rows)


def _figure(data: dict):
    from matplotlib.figure import Figure

    sweep = sorted(data["expert_parallel"], key=lambda p: (p["capacity_factor"] == 0, p["capacity_factor"]))
    labels = [f"{p['capacity_factor']:g}" if p["capacity_factor"] else "0\n(dropless)" for p in sweep]
    x = np.arange(len(sweep))
    figure = Figure(figsize=(16, 4.5), layout="constrained")
    drops, speed, balance = figure.subplots(1, 3)
    drops.bar(x, [p["drop_rate"] * 100 for p in sweep], color="tab:red")
    drops.set(xticks=x, xticklabels=labels, xlabel="capacity factor", ylabel="pairs dropped (%)",
              title=f"Drop rate, EP={data['settings']['ep']}")
    speed.bar(x, [p["tokens_per_second"] for p in sweep], color="tab:blue", label=f"EP={data['settings']['ep']}")
    speed.axhline(data["one_process"]["tokens_per_second"], color="black", linestyle="--", label="one process")
    share = speed.twinx()
    share.plot(x, [p["comm_share"] * 100 for p in sweep], color="tab:orange", marker="o", label="comm share")
    share.set(ylabel="all-to-all share of step time (%)", ylim=(0, 100))
    share.legend(loc="lower right")
    speed.set(xticks=x, xticklabels=labels, xlabel="capacity factor", ylabel="tokens/s",
              title="Throughput and communication share")
    speed.legend(loc="lower left")
    dropless = next((p for p in sweep if p["capacity_factor"] == 0), sweep[-1])
    layers = dropless["balancedness_per_layer"]
    balance.bar(np.arange(len(layers)) - 0.2, layers, width=0.4, label="identity placement", color="tab:gray")
    if "after" in data["placement"]:
        balance.bar(np.arange(len(layers)) + 0.2, data["placement"]["after"]["balancedness_per_layer"], width=0.4,
                    label="placed by measured heat", color="tab:green")
    balance.set(xticks=np.arange(len(layers)), xlabel="MoE layer", ylabel="balancedness (mean/max pairs per rank)",
                ylim=(0, 1.05), title=f"Balance; re-placement stall {data['replacement']['mean_seconds'] * 1e3:.0f} ms")
    balance.legend(loc="lower left")
    return figure
