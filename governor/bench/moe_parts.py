"""`governor bench moe`: the MoE runtime part (engine/bench/moe.py) and the planner part (engine/bench/planner.py)."""
from __future__ import annotations

import argparse

PARTS = ("runtime", "planner")


def add_moe_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from engine.bench.moe import add_moe_arguments
    from engine.bench.planner import add_planner_arguments

    parser.add_argument("--part", choices=[*PARTS, "all"], default="all", help="which part to run (default: all)")
    add_moe_arguments(parser)
    add_planner_arguments(parser)


def run_moe_bench_parts(args: argparse.Namespace) -> int:
    from engine.bench.moe import run_moe_bench
    from engine.bench.planner import run_planner_bench

    runs = {"runtime": run_moe_bench, "planner": run_planner_bench}
    for part in PARTS if args.part == "all" else (args.part,):
        status = runs[part](args)
        if status:
            return status
    return 0
