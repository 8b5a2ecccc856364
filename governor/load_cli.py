"""`governor load`: send open-loop traffic to an OpenAI-compatible server and report what it measured."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from governor.loadgen import arrivals, prompts
from governor.loadgen.phases import DEMO_FILE, Phase, PhaseFileError, load_phases
from governor.loadgen.runner import LoadError, LoadResult, run_phases

QUICK_FLAGS = {
    "qps": "--qps",
    "duration_s": "--duration",
    "prompts": "--prompts",
    "arrival": "--arrival",
    "burst_size": "--burst-size",
    "prompt_bytes": "--prompt-bytes",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "max_tokens": "--max-tokens",
}
QUICK_DEFAULTS = {"qps": 2.0, "duration_s": 30.0}


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default: %(default)s)")
    parser.add_argument("--model", help="model id to request (default: the first from GET /v1/models)")
    parser.add_argument("--phases", type=Path, metavar="FILE",
                        help=f"YAML phase file (default: {DEMO_FILE.name}, once)")
    quick = parser.add_argument_group("one phase from flags, instead of --phases")
    quick.add_argument("--qps", type=_positive(float),
                       help=f"mean requests per second (default: {QUICK_DEFAULTS['qps']})")
    quick.add_argument("--duration", type=_positive(float), metavar="SECONDS",
                       help=f"how long to send (default: {QUICK_DEFAULTS['duration_s']})")
    quick.add_argument("--prompts", choices=prompts.KINDS, help="prompt set (default: code)")
    quick.add_argument("--arrival", choices=arrivals.KINDS, help="arrival process (default: poisson)")
    quick.add_argument("--burst-size", type=_positive(int), metavar="N", help="requests per burst (default: 8)")
    quick.add_argument("--prompt-bytes", type=_positive(int), metavar="N",
                       help="longest prompt in bytes (default: 300)")
    quick.add_argument("--temperature", type=float, help="sampling temperature, 0..2 (default: 0)")
    quick.add_argument("--top-p", type=float, help="nucleus sampling, (0, 1] (default: 1)")
    quick.add_argument("--max-tokens", type=_positive(int), metavar="N", help="tokens per request (default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="arrivals and prompts are the same for the same seed")
    parser.add_argument("--max-concurrency", type=_positive(int), default=256, metavar="N",
                        help="requests in flight beyond this are dropped and counted (default: %(default)s)")
    parser.add_argument("--drain-timeout", type=_positive(float), default=60.0, metavar="SECONDS",
                        help="wait this long for requests still in flight at the end (default: %(default)s)")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write per-request records and per-phase summaries as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run_load(args: argparse.Namespace) -> int:
    try:
        phases = phases_from_args(args)
    except PhaseFileError as e:
        print(f"governor load: error: {e}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(_run(args, phases))
    except LoadError as e:
        print(f"governor load: error: {e}", file=sys.stderr)
        return 1
    print(format_summary(result))
    if args.out:
        result.write_json(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if any(p.completed for p in result.phases) else 1


def phases_from_args(args: argparse.Namespace) -> list[Phase]:
    given = {field: getattr(args, flag[2:].replace("-", "_")) for field, flag in QUICK_FLAGS.items()}
    given = {field: value for field, value in given.items() if value is not None}
    if not given:
        return load_phases(args.phases or DEMO_FILE)
    if args.phases:
        flags = ", ".join(QUICK_FLAGS[field] for field in given)
        raise PhaseFileError(f"--phases and the one-phase flags ({flags}) exclude each other")
    try:
        return [Phase(name="flags", **{**QUICK_DEFAULTS, **given})]
    except ValidationError as e:
        raise PhaseFileError(
            "; ".join(f"{QUICK_FLAGS.get(err['loc'][0], err['loc'][0])}: {err['msg']}" for err in e.errors())
        ) from None


def format_summary(result: LoadResult) -> str:
    lines = [
        f"model {result.model} at {result.base_url}, seed {result.seed}",
        f"{'phase':<16} {'sent':>5} {'ok':>5} {'err':>4} {'drop':>4} {'tok/s':>7}"
        f" {'ttft p50/p99 ms':>16} {'itl p50/p99 ms':>15} {'e2e p50/p99 s':>14}",
    ]
    for p in result.phases:
        lines.append(
            f"{p.name:<16} {p.requests:>5} {p.completed:>5} {p.errors:>4} {p.dropped:>4} {p.tokens_per_s:>7.1f}"
            f" {_pair(p.ttft_s, 1e3, 0):>16} {_pair(p.itl_s, 1e3, 1):>15} {_pair(p.e2e_s, 1, 2):>14}"
        )
    errors = [r.error for r in result.records if r.error]
    if errors:
        lines.append(f"first error: {errors[0]}")
    return "\n".join(lines)


async def _run(args: argparse.Namespace, phases: list[Phase]) -> LoadResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    try:
        return await run_phases(
            args.url, phases, model=args.model, seed=args.seed, max_concurrency=args.max_concurrency,
            drain_timeout_s=args.drain_timeout, progress=not args.quiet, stop=stop,
        )
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError, ValueError):
            pass


def _pair(quantiles: dict[str, float] | None, scale: float, digits: int) -> str:
    if not quantiles:
        return "-"
    return f"{quantiles['p50'] * scale:.{digits}f}/{quantiles['p99'] * scale:.{digits}f}"


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse
