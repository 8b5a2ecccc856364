"""The `governor` command line: serve, load, bench, plan, control, policy."""
from __future__ import annotations

import argparse
import sys

from governor.bench import add_bench_commands
from governor.control_cli import add_control_arguments, add_policy_arguments, run_control
from governor.load_cli import add_load_arguments, run_load
from governor.plan_cli import add_plan_arguments, run_plan
from governor.serve import add_serve_arguments, run_serve

# name, help, add_arguments(parser), run(args) -> exit status (None: its subcommands set their own)
COMMANDS = (
    ("serve", "run the engine and its OpenAI-compatible API", add_serve_arguments, run_serve),
    ("load", "open-loop traffic generator", add_load_arguments, run_load),
    ("bench", "benchmarks that print figures and write JSON + PNG", add_bench_commands, None),
    ("plan", "expert placement from measured heat, as JSON", add_plan_arguments, run_plan),
    ("control", "run the controller against remote engines", add_control_arguments, run_control),
    ("policy", "controller policy files", add_policy_arguments, None),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="governor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_line, add_arguments, run in COMMANDS:
        command = commands.add_parser(name, help=help_line)
        add_arguments(command)
        if run is not None:
            command.set_defaults(run=run)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
