"""The control plane: a Controller on its store and policy, its alert intake, and its admin router; with a lease
(`governor control`), a standby-ready pair: the controller acts only while it holds the lease."""
from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter

from controller.clients import EngineClient, HttpClient
from controller.counters import MetricsSink
from controller.loop import Controller
from controller.operate.admin import create_admin_router
from controller.operate.alerts import AlertIntake
from controller.operate.lease import Lease
from controller.operate.retention import RetentionSweeper
from controller.operate.standby import LeaderLoop
from controller.store import Store
from controller.trials.canary import FleetCanary
from policies import Policy, load_policy


@dataclass
class ControlPlane:
    controller: Controller
    intake: AlertIntake
    router: APIRouter
    retention: RetentionSweeper
    leader: LeaderLoop | None = None        # set when the controller leads by a lease

    def start(self) -> None:
        (self.leader or self.controller).start()
        self.retention.start()

    def stop(self) -> None:
        self.retention.stop()
        (self.leader or self.controller).stop()

    def fault(self) -> str | None:
        return (self.leader or self.controller).fault()


def build_control_plane(client: EngineClient, policy: Policy | str, db_url: str, admin_token: str | None,
                        metrics: MetricsSink | None = None, on_decision=None, policy_name: str | None = None,
                        retention_days: float = 0.0, lease_holder: str | None = None) -> ControlPlane:
    """policy: a Policy, or a file or shipped name to load (PolicyError if bad); the store is created if missing.
    retention_days: records older than this are pruned once an hour while the plane runs (0: kept forever).
    lease_holder: lead by the database's leader lease under this name ('' for a generated one); None: lead alone,
    at once (the in-process controller of `governor serve`)."""
    if isinstance(policy, str):
        policy, policy_name = load_policy(policy), policy
    store = Store(db_url)
    if isinstance(client, HttpClient) and len(client.urls) > 1:     # reads the policy in force at each trial
        client = FleetCanary(client, lambda: controller.policy.trial)
    controller = Controller(client, store, policy, policy_name or "custom", metrics=metrics, on_decision=on_decision,
                            resume=lease_holder is None)
    if lease_holder is None:
        intake = AlertIntake(controller)
        return ControlPlane(controller, intake, create_admin_router(controller, intake, admin_token),
                            RetentionSweeper(controller, retention_days))
    lease = Lease(store, lambda: controller.policy.window.seconds, lease_holder or None)
    intake = AlertIntake(controller, lease.leading)
    router = create_admin_router(controller, intake, admin_token, lease=lease)
    return ControlPlane(controller, intake, router, RetentionSweeper(controller, retention_days, lease.leading),
                        LeaderLoop(controller, lease, intake))


def print_decision(decision_id: int, action: str, reason: str) -> None:
    print(f"decision {decision_id} {action}: {reason}", flush=True)
