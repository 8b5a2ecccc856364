"""`governor control` (the controller beside remote engines), `governor policy check`, and the wiring that
`governor serve` uses to run the controller in-process."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from dataclasses import dataclass

from fastapi import APIRouter

from controller.admin import create_admin_router
from controller.alerts import AlertIntake
from controller.clients import EngineClient, EngineClientError, HttpClient
from controller.loop import Controller
from controller.metrics import MetricsSink
from controller.retention import RetentionSweeper
from controller.store import Store, StoreError
from policies import Policy, PolicyError, load_policy


@dataclass
class ControlPlane:
    controller: Controller
    intake: AlertIntake
    router: APIRouter
    retention: RetentionSweeper

    def start(self) -> None:
        self.controller.start()
        self.retention.start()

    def stop(self) -> None:
        self.retention.stop()
        self.controller.stop()


def build_control_plane(client: EngineClient, policy: Policy | str, db_url: str, admin_token: str | None,
                        metrics: MetricsSink | None = None, on_decision=None, policy_name: str | None = None,
                        retention_days: float = 0.0) -> ControlPlane:
    """policy: a Policy, or a file or shipped name to load (PolicyError if bad); the store is created if missing.
    retention_days: records older than this are pruned once an hour while the plane runs (0: kept forever)."""
    if isinstance(policy, str):
        policy, policy_name = load_policy(policy), policy
    controller = Controller(client, Store(db_url), policy, policy_name or "custom", metrics=metrics,
                            on_decision=on_decision)
    intake = AlertIntake(controller)
    return ControlPlane(controller, intake, create_admin_router(controller, intake, admin_token),
                        RetentionSweeper(controller, retention_days))


def add_control_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", required=True, metavar="URL",
                        help="a remote engine's base URL (repeat for replicas); admin token from GOVERNOR_ADMIN_TOKEN")
    parser.add_argument("--policy", default="default", help="policy YAML file or shipped policy name (default)")
    parser.add_argument("--db", default="sqlite:///governor.db", help="SQLAlchemy URL of the store")
    parser.add_argument("--retention-days", type=float, default=30.0,
                        help="prune decisions, trials and windows older than this (default 30; 0 keeps all)")


def print_decision(decision_id: int, action: str, reason: str) -> None:
    print(f"decision {decision_id} {action}: {reason}", flush=True)


def run_control(args: argparse.Namespace) -> int:
    stop = threading.Event()     # set before the plane is built: a SIGTERM while it resumes still stops it cleanly
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        client = HttpClient(args.engine, os.environ.get("GOVERNOR_ADMIN_TOKEN"))
        plane = build_control_plane(client, args.policy, args.db, None, on_decision=print_decision,
                                    retention_days=args.retention_days)
    except (PolicyError, StoreError) as error:
        flag = "--policy" if isinstance(error, PolicyError) else "--db"
        print(f"governor control: {flag}: {error}", file=sys.stderr)
        return 2
    except EngineClientError as error:
        print(f"governor control: {error}", file=sys.stderr)
        return 1
    plane.start()
    stop.wait()
    plane.stop()
    return 0


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="policy_command", required=True)
    check = commands.add_parser("check", help="validate a policy file: exit 0 with a summary, 2 with the error")
    check.add_argument("file", help="policy YAML file (or a shipped policy's name)")
    check.set_defaults(run=run_policy_check)


def run_policy_check(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as error:
        print(f"governor policy check: {error}", file=sys.stderr)
        return 2
    slo = policy.slo
    print(f"{args.file}: ok, {policy.kind} policy; window {policy.window.seconds:g} s "
          f"(>= {policy.window.min_emitted_tokens} tokens to judge); SLO inter-token p99 "
          f"{slo.inter_token_p99_seconds} s, TTFT p99 {slo.ttft_p99_seconds} s; speculation kept at >= "
          f"{policy.speculation.min_gain}x over plain (re-enabled at >= "
          f"{policy.speculation.min_gain + policy.speculation.hysteresis:g}x), k <= {policy.speculation.k_max}; "
          f"{len(policy.alerts.overrides)} alert overrides")
    return 0
