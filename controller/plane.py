"""The control plane: a Controller on its store and policy, its alert intake, and its admin router."""
from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter

from controller.admin import create_admin_router
from controller.alerts import AlertIntake
from controller.clients import EngineClient
from controller.counters import MetricsSink
from controller.loop import Controller
from controller.retention import RetentionSweeper
from controller.store import Store
from policies import Policy, load_policy


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


def print_decision(decision_id: int, action: str, reason: str) -> None:
    print(f"decision {decision_id} {action}: {reason}", flush=True)
