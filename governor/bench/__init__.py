"""Benchmarks behind `governor bench ...`: each measures the engine beside a peer and writes JSON plus a PNG.

One registration pattern: a benchmark module names itself (NAME, HELP) and offers add_arguments(parser) and
run(args) -> exit status; BENCHMARKS lists the ones `governor bench` offers.
"""
from __future__ import annotations

import argparse

from governor.bench import (controller_vs_static, hostile, moe_parts, old_vs_switchback_judge, overload, soak,
                            speculation, telemetry_overhead)

BENCHMARKS = (speculation, telemetry_overhead, moe_parts, controller_vs_static, old_vs_switchback_judge, overload,
              hostile, soak)


def add_bench_commands(parser: argparse.ArgumentParser) -> None:
    benches = parser.add_subparsers(dest="bench", required=True)
    for bench in BENCHMARKS:
        command = benches.add_parser(bench.NAME, help=bench.HELP)
        bench.add_arguments(command)
        command.set_defaults(run=bench.run)
