"""`governor bench moe --part planner`: the placement planner beside DeepSeek EPLB's greedy, on Zipf-skewed heat.

Per skew s (expert popularity ~ 1 / rank^s, a fresh random expert order per layer, token counts drawn from it)
and per slot count (no spare slot, and spare slots for replicas): balancedness of the identity placement, of EPLB's
hierarchical policy (one expert group per node), of EPLB's global policy and of ours, and the median time each
planner takes. Writes moe_planner.json and moe_planner.png.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from controller.decide.planner import plan_placement
from governor.bench import report
from governor.bench.eplb import eplb_placement
from seam.placement import Topology, identity_placement, placement_balancedness, slot_tokens, tokens_per_device

LAYERS, EXPERTS, DEVICES, NODES = 64, 256, 64, 8
TOKENS_PER_LAYER = 8 * 65536            # top-8 routing of a 64k-token window
SKEWS = (0.0, 0.5, 1.0, 1.5, 2.0)
SLOTS_PER_DEVICE = (4, 5)               # 256 slots: no spare; 320 slots: 64 spare slots for replicas
HEATMAP_SKEW, HEATMAP_SLOTS = 1.0, 5
PLAN_SECONDS_TARGET = 0.05
QUICK_LAYERS, QUICK_SKEWS = 8, (0.0, 1.0, 2.0)
NOTES = {
    "balancedness": "vLLM's: sum over layers of mean tokens per device / sum over layers of max tokens per device; "
                    "a replicated expert's tokens split evenly over its replicas",
    "eplb_hierarchical": "DeepSeek EPLB's greedy, hierarchical policy: one expert group per node (written from its "
                         "description; the peer)",
    "eplb_global": "DeepSeek EPLB's greedy, global policy (one group, one node)",
    "split_experts": "(layer, expert) pairs whose replicas sit on more than one node",
    "plan_seconds": "median wall time of --repeats plans of all layers; EPLB plans layer by layer, as EPLB does",
    "plan_cpu_seconds": "median CPU time of the same plans (one thread): on a busy machine wall time also counts "
                        "waiting for a core; see machine.load_average",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=report.int_in(1, 1000), default=5,
                        help="timed plans per planner and load (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the expert orders and token draws")


def run(args: argparse.Namespace) -> int:
    started, machine = time.perf_counter(), report.machine()
    layers = QUICK_LAYERS if args.quick else LAYERS
    skews = QUICK_SKEWS if args.quick else SKEWS
    repeats = 1 if args.quick else max(1, args.repeats)
    rng = np.random.default_rng(args.seed)
    heats = {skew: zipf_heat(layers, EXPERTS, skew, rng) for skew in skews}
    cases = [_bench_case(heats[skew], skew, Topology(NODES, DEVICES, slots), repeats)
             for slots in SLOTS_PER_DEVICE for skew in skews]
    full_size = not args.quick
    targets = [
        {"target": "balancedness >= EPLB greedy (both policies) on every load",
         "value": min(c["ours_over_eplb"] for c in cases), "met": all(c["ours_over_eplb"] >= 1 for c in cases)},
        {"target": f"plan < {PLAN_SECONDS_TARGET * 1000:.0f} ms at {LAYERS} layers x {EXPERTS} experts x "
                   f"{DEVICES} devices ({NODES} nodes)",
         "value": max(c["plan_seconds"]["ours"] for c in cases),
         "met": full_size and all(c["plan_seconds"]["ours"] < PLAN_SECONDS_TARGET for c in cases)},
    ]
    data = {
        "benchmark": "moe_planner",
        "command": report.command("governor bench moe", args),
        "machine": {**machine, "load_average_at_end": report.load_average()},
        "settings": {"layers": layers, "experts": EXPERTS, "devices": DEVICES, "nodes": NODES,
                     "tokens_per_layer": TOKENS_PER_LAYER, "repeats": repeats, "seed": args.seed,
                     "quick": args.quick},
        "notes": NOTES,
        "cases": cases,
        "targets": targets,
        "wall_seconds": time.perf_counter() - started,
    }
    heat = heats.get(HEATMAP_SKEW, heats[skews[len(skews) // 2]])
    report.write_results(args.out, "moe_planner", data, _figure(data, heat, Topology(NODES, DEVICES, HEATMAP_SLOTS)),
                         _summary(data))
    return 0


def zipf_heat(layers: int, experts: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    """[layers, experts] token counts: popularity 1 / rank^skew over a random expert order per layer."""
    popularity = 1.0 / np.arange(1, experts + 1) ** skew
    return np.stack([rng.multinomial(TOKENS_PER_LAYER, rng.permutation(popularity) / popularity.sum())
                     for _ in range(layers)]).astype(np.float64)


def split_experts(phy2log: list[list[int]], topology: Topology) -> int:
    """(layer, expert) pairs whose replicas sit on more than one node."""
    slots = np.asarray(phy2log)
    node = np.arange(topology.num_slots) // (topology.devices_per_node * topology.slots_per_device)
    layers, experts = slots.shape[0], slots.max() + 1
    cell = (np.arange(layers)[:, None] * experts + slots) * topology.nodes + node[None, :]
    held = np.bincount(cell.ravel(), minlength=layers * experts * topology.nodes).reshape(layers, experts, -1) > 0
    return int((held.sum(axis=-1) > 1).sum())


PLANNERS = {
    "ours": plan_placement,
    "eplb_hierarchical": lambda heat, topology: eplb_placement(heat, topology, num_groups=topology.nodes),
    "eplb_global": lambda heat, topology: eplb_placement(heat, topology, num_groups=1),
}


def _bench_case(heat: np.ndarray, skew: float, topology: Topology, repeats: int) -> dict:
    identity = identity_placement(*heat.shape, topology)
    balancedness = {"identity": placement_balancedness(heat, identity, topology)}
    split = {"identity": split_experts(identity, topology)}
    seconds, cpu_seconds = {}, {}
    for name, planner in PLANNERS.items():
        walls, cpus = [], []
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            phy2log = planner(heat, topology)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        seconds[name], cpu_seconds[name] = statistics.median(walls), statistics.median(cpus)
        balancedness[name] = placement_balancedness(heat, phy2log, topology)
        split[name] = split_experts(phy2log, topology)
    best_peer = max(balancedness["eplb_hierarchical"], balancedness["eplb_global"])
    case = {"skew": skew, "slots_per_device": topology.slots_per_device,
            "spare_slots": topology.num_slots - heat.shape[1], "balancedness": balancedness,
            "split_experts": split, "plan_seconds": seconds, "plan_cpu_seconds": cpu_seconds,
            "ours_over_eplb": balancedness["ours"] / best_peer,
            "eplb_seconds_over_ours": min(seconds["eplb_hierarchical"], seconds["eplb_global"]) / seconds["ours"]}
    report.progress(f"skew {skew:.1f}  {case['spare_slots']:3d} spare slots  balancedness identity "
                    f"{balancedness['identity']:.4f}  EPLB hier {balancedness['eplb_hierarchical']:.4f}  "
                    f"EPLB global {balancedness['eplb_global']:.4f}  ours {balancedness['ours']:.4f}  "
                    f"plan {seconds['ours'] * 1000:.1f} ms (EPLB {seconds['eplb_hierarchical'] * 1000:.1f} / "
                    f"{seconds['eplb_global'] * 1000:.1f} ms)")
    return case


# -- figure and summary -----------------------------------------------------------------------------------------


def _figure(data: dict, heat: np.ndarray, topology: Topology):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(22, 10), layout="constrained")
    axes = figure.subplots(2, 3)
    for ax, slots in zip(axes[0][:2], SLOTS_PER_DEVICE):
        _plot_balancedness(ax, [c for c in data["cases"] if c["slots_per_device"] == slots])
    _plot_seconds(axes[0][2], data["cases"])
    placements = {"identity": identity_placement(*heat.shape, topology),
                  "EPLB global": PLANNERS["eplb_global"](heat, topology), "ours": plan_placement(heat, topology)}
    loads = {name: tokens_per_device(slot_tokens(heat, phy2log), topology) / heat.sum(axis=1, keepdims=True)
             * topology.devices for name, phy2log in placements.items()}                     # 1 = the mean load
    planned = np.stack([loads["EPLB global"], loads["ours"]])
    scales = {"identity": (0.0, loads["identity"].max()), "EPLB global": (planned.min(), planned.max()),
              "ours": (planned.min(), planned.max())}
    for ax, (name, load) in zip(axes[1], loads.items()):
        image = ax.imshow(load, aspect="auto", cmap="magma", vmin=scales[name][0], vmax=scales[name][1],
                          interpolation="nearest")
        ax.set(title=f"{name}: tokens per device / mean (skew {HEATMAP_SKEW}, {topology.num_slots - heat.shape[1]} "
                     f"spare slots)", xlabel="device (white lines: nodes)", ylabel="layer")
        for node in range(1, topology.nodes):
            ax.axvline(node * topology.devices_per_node - 0.5, color="white", linewidth=0.5)
        shared = " (scale shared with EPLB)" if name == "ours" else ""
        figure.colorbar(image, ax=ax, label="load / mean load" + shared)
    figure.suptitle(f"Expert placement: {data['settings']['layers']} layers x {EXPERTS} experts on {DEVICES} "
                    f"devices ({NODES} nodes), Zipf-skewed heat")
    return figure


def _plot_balancedness(ax, cases: list[dict]) -> None:
    names = ["identity", "eplb_hierarchical", "eplb_global", "ours"]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        positions = [j + (i - 1.5) * width for j in range(len(cases))]
        ax.bar(positions, [c["balancedness"][name] for c in cases], width, label=name.replace("_", " "))
    ax.set_xticks(range(len(cases)), [f"s={c['skew']:.1f}" for c in cases])
    ax.set(title=f"balancedness, {cases[0]['spare_slots']} spare slots", xlabel="Zipf skew", ylabel="balancedness",
           ylim=(0, 1.05))
    ax.legend(fontsize=8)


def _plot_seconds(ax, cases: list[dict]) -> None:
    labels = [f"s={c['skew']:.1f}\n+{c['spare_slots']}" for c in cases]
    for i, name in enumerate(PLANNERS):
        ax.plot(range(len(cases)), [1000 * c["plan_seconds"][name] for c in cases], "o-", label=name.replace("_", " "))
    ax.axhline(1000 * PLAN_SECONDS_TARGET, color="gray", linestyle="--", label="50 ms target")
    ax.set_xticks(range(len(cases)), labels, fontsize=7)
    ax.set(title="time to plan all layers (median)", ylabel="ms", xlabel="skew, spare slots")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


def _summary(data: dict) -> str:
    headers = ["skew", "spare", "identity", "EPLB hier", "EPLB global", "ours", "ours/EPLB", "ours ms", "(CPU)",
               "EPLB ms",
               "split: ours", "EPLB global"]
    rows = [[f"{c['skew']:.1f}", str(c["spare_slots"]), *(f"{c['balancedness'][n]:.4f}" for n in
             ("identity", "eplb_hierarchical", "eplb_global", "ours")), f"{c['ours_over_eplb']:.4f}",
             f"{1000 * c['plan_seconds']['ours']:.1f}", f"{1000 * c['plan_cpu_seconds']['ours']:.1f}",
             f"{1000 * min(c['plan_seconds']['eplb_hierarchical'], c['plan_seconds']['eplb_global']):.1f}",
             str(c["split_experts"]["ours"]), str(c["split_experts"]["eplb_global"])]
            for c in data["cases"]]
    verdicts = [f"  [{'met' if t['met'] else 'NOT met'}] {t['target']}: {t['value']:.4f}" for t in data["targets"]]
    return "\n".join([report.table(headers, rows), "targets:", *verdicts])
