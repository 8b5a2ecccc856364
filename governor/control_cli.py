"""`governor control` (the controller beside remote engines) and `governor policy check`."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from controller.clients import EngineClientError, HttpClient
from controller.plane import build_control_plane, print_decision
from controller.store import StoreError
from governor.control_app import ControlServer, create_control_app
from governor.settings import DEFAULT_DB, DEFAULT_POLICY, DEFAULT_RETENTION_DAYS
from policies import Policy, PolicyError, load_policy


def add_control_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", required=True, metavar="URL",
                        help="a remote engine's base URL (repeat for replicas); admin token from GOVERNOR_ADMIN_TOKEN")
    parser.add_argument("--policy", default=DEFAULT_POLICY,
                        help="policy YAML file or shipped policy name (default: %(default)s)")
    parser.add_argument("--db", default=DEFAULT_DB, help="SQLAlchemy URL of the store (default: %(default)s)")
    parser.add_argument("--retention-days", type=float, default=DEFAULT_RETENTION_DAYS,
                        help="prune decisions, trials and windows older than this (default: %(default)s; 0 keeps all)")
    parser.add_argument("--host", default="127.0.0.1", help="address of the admin API and alert webhook (--port)")
    parser.add_argument("--port", type=int, default=None,
                        help="serve the admin API and the Alertmanager webhook on this port (default: none)")
    parser.add_argument("--holder", default="",
                        help="this process's name in the leader lease (default: host:pid:random); every `governor "
                             "control` on one database leads by that lease, the others stand by")


def run_control(args: argparse.Namespace) -> int:
    stop = threading.Event()     # set before the plane is built: a SIGTERM while it resumes still stops it cleanly
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        client = HttpClient(args.engine, os.environ.get("GOVERNOR_ADMIN_TOKEN"))
        plane = build_control_plane(client, args.policy, args.db, os.environ.get("GOVERNOR_ADMIN_TOKEN"),
                                    on_decision=print_decision, retention_days=args.retention_days,
                                    lease_holder=args.holder)
    except (PolicyError, StoreError) as error:
        flag = "--policy" if isinstance(error, PolicyError) else "--db"
        print(f"governor control: {flag}: {error}", file=sys.stderr)
        return 2
    except EngineClientError as error:
        print(f"governor control: {error}", file=sys.stderr)
        return 1
    server = None if args.port is None else ControlServer(create_control_app(plane), args.host, args.port)
    if server is not None:
        try:
            server.start()
        except RuntimeError as error:
            print(f"governor control: --port: {error}", file=sys.stderr)
            return 2
    plane.start()
    stop.wait()
    plane.stop()
    if server is not None:
        server.stop()
    return 0


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="policy_command", required=True)
    check = commands.add_parser("check", help="validate a policy file: exit 0 with a summary, 2 with the error")
    check.add_argument("file", help="policy YAML file (or a shipped policy's name)")
    check.set_defaults(run=run_policy_check)


def policy_or_none(spec: str, prefix: str) -> Policy | None:
    """The policy a file or shipped name holds, or None after saying why on stderr (prefix: command and flag)."""
    try:
        return load_policy(spec)
    except PolicyError as error:
        print(f"{prefix}: {error}", file=sys.stderr)
        return None


def run_policy_check(args: argparse.Namespace) -> int:
    policy = policy_or_none(args.file, "governor policy check")
    if policy is None:
        return 2
    slo = policy.slo
    print(f"{args.file}: ok, {policy.kind} policy; window {policy.window.seconds:g} s "
          f"(>= {policy.window.min_emitted_tokens} tokens to judge); SLO inter-token p99 "
          f"{slo.inter_token_p99_seconds} s, TTFT p99 {slo.ttft_p99_seconds} s; speculation kept at >= "
          f"{policy.speculation.min_gain}x over plain (re-enabled at >= "
          f"{policy.speculation.min_gain + policy.speculation.hysteresis:g}x), k <= {policy.speculation.k_max}; "
          f"{len(policy.alerts.overrides)} alert overrides")
    return 0
