"""`governor bench moe`: the MoE runtime part (moe_runtime.py) and the planner part (planner_vs_eplb.py)."""
from __future__ import annotations

import argparse

from governor.bench import moe_runtime, planner_vs_eplb

NAME = "moe"
HELP = "MoE: one process vs expert parallelism, capacity factors, placement; the planner beside DeepSeek EPLB's greedy"
PARTS = {"runtime": moe_runtime, "planner": planner_vs_eplb}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all", help="which part to run (default: all)")
    for part in PARTS.values():
        part.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    for name in PARTS if args.part == "all" else (args.part,):
        status = PARTS[name].run(args)
        if status:
            return status
    return 0
