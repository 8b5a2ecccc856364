"""The controller's admin API: reads (window, config, decisions, history, trials, alerts, policy) and
token-guarded writes (pin a config, release, roll back, switch policy, start/stop an Optuna search,
Alertmanager webhook)."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from controller.alerts import AlertIntake, AlertmanagerPayload
from controller.clients import ApplyFailed, EngineClientError
from controller.loop import Controller
from engine.api_common import APIError, bearer_guard, invalid_body
from policies import PolicyError, load_policy, parse_policy, shipped_policies
from seam import EngineConfig


class PolicySwitch(BaseModel):
    """Either the name of a shipped policy, or a whole policy document."""
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    policy: dict | None = None

    @model_validator(mode="after")
    def _one(self) -> PolicySwitch:
        if (self.name is None) == (self.policy is None):
            raise ValueError("give exactly one of 'name' (a shipped policy) or 'policy' (a policy document)")
        return self


def create_admin_router(controller: Controller, intake: AlertIntake, admin_token: str | None) -> APIRouter:
    admin = [Depends(bearer_guard(admin_token))]
    router = APIRouter()

    @router.get("/admin/window")
    async def window():
        if controller.latest is None:
            raise APIError(404, "the controller has not closed a window yet", kind="not_found_error")
        return controller.latest.to_dict()

    @router.get("/admin/config")
    async def get_config():
        return controller.current.model_dump()

    @router.get("/admin/controller")
    async def state():
        return controller.state()

    @router.put("/admin/config", dependencies=admin)
    async def pin_config(request: Request):
        try:
            config = EngineConfig.model_validate_json(await request.body())
            decision = controller.pin(config, "operator", "operator override via PUT /admin/config")
        except ValidationError as error:
            raise invalid_body(error) from error
        except ApplyFailed as error:
            raise APIError(503, str(error), kind="server_error", code="apply_failed") from error
        except EngineClientError as error:
            raise APIError(400, str(error), "body") from error
        return {"config": controller.current.model_dump(), "pinned": True, "decision": decision}

    @router.post("/admin/release", dependencies=admin)
    async def release():
        try:
            decision = controller.release("operator released the pin via POST /admin/release")
        except ApplyFailed as error:
            raise APIError(503, str(error), kind="server_error", code="apply_failed") from error
        if decision is None:
            raise APIError(409, "no config is pinned", kind="conflict_error")
        return {"config": controller.current.model_dump(), "pinned": False, "decision": decision}

    @router.post("/admin/rollback", dependencies=admin)
    async def rollback():
        try:
            decision = controller.rollback("operator rollback via POST /admin/rollback", lift_pin=True)
        except ApplyFailed as error:
            raise APIError(503, str(error), kind="server_error", code="apply_failed") from error
        return {"config": controller.current.model_dump(), "decision": decision}

    @router.get("/admin/decisions")
    async def decisions(limit: int = Query(100, ge=1, le=10_000), action: str | None = None):
        filters = {"action": action} if action else {}
        return {"decisions": controller.store.decisions(limit, **filters)}

    @router.get("/admin/history")
    async def history(limit: int = Query(100, ge=1, le=10_000)):
        return {"versions": controller.store.config_versions(limit),
                "last_known_good": controller.last_known_good.version}

    @router.get("/admin/trials")
    async def trials(limit: int = Query(100, ge=1, le=10_000)):
        return {"trials": controller.store.trials(limit)}

    @router.get("/admin/alerts")
    async def alerts(limit: int = Query(100, ge=1, le=10_000)):
        return {"alerts": controller.store.alerts(limit)}

    @router.get("/admin/policy")
    async def get_policy():
        return {"name": controller.policy_name, "policy": controller.policy.model_dump(), "shipped": shipped_policies()}

    @router.put("/admin/policy", dependencies=admin)
    async def switch_policy(body: PolicySwitch):
        try:
            if body.name is not None:
                if body.name not in shipped_policies():
                    raise APIError(400, f"name: unknown policy {body.name!r}; shipped: {', '.join(shipped_policies())}",
                                   "name")
                policy, name = load_policy(body.name), body.name
            else:
                policy, name = parse_policy(body.policy, "policy"), "custom"
        except PolicyError as error:
            raise APIError(400, str(error), error.field) from error
        decision = controller.switch_policy(policy, name)
        return {"name": name, "decision": decision}

    def switched(decision: int | None, refusal: str) -> dict:
        if decision is None:
            raise APIError(409, f"{refusal} (policy {controller.policy_name})", kind="conflict_error")
        return {"name": controller.policy_name, "decision": decision}

    @router.post("/admin/search/start", dependencies=admin)
    async def start_search():
        return switched(controller.start_search(load_policy("optuna"), "optuna"),
                        "an Optuna search is already running")

    @router.post("/admin/search/stop", dependencies=admin)
    async def stop_search():
        return switched(controller.stop_search(load_policy("default"), "default"), "no Optuna search is running")

    @router.post("/alerts", dependencies=admin)
    async def receive_alerts(payload: AlertmanagerPayload):
        """5xx while any alert's action failed, so that Alertmanager delivers the notification again."""
        outcome = intake.receive(payload)
        if outcome["failed"]:
            return JSONResponse(status_code=503, content=outcome)
        return outcome

    return router
