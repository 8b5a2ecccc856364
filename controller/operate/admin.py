"""The controller's admin API: reads (window, config, decisions, history, trials, alerts, policy) and
token-guarded writes (pin a config, release, roll back, switch policy, start/stop an Optuna search,
Alertmanager webhook). On a standby controller (one that leads by a lease and does not hold it) the writes answer
409 naming the leader, and the webhook records each alert for the leader to act on."""
from __future__ import annotations

from asyncio import to_thread
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from controller.clients import ApplyFailed, EngineClientError
from controller.loop import Controller
from controller.operate.actions import Operator
from controller.operate.alerts import AlertIntake, AlertmanagerPayload
from controller.operate.lease import Lease
from policies import Policy, PolicyError, load_policy, parse_policy, shipped_policies
from seam import EngineConfig
from seam.http import APIError, bearer_guard, invalid_body
from seam.openapi import ERRORS, error, json_body

MAX_PAGE = 1000         # rows one read returns at most
Page = Annotated[int, Query(ge=1, le=MAX_PAGE, description="rows, newest first")]
CONFLICT = {409: error("the state does not allow it now (see the message)")}
APPLY_FAILED = {503: error("the engine failed to apply the config (error.code apply_failed)")}
ALERT_FAILED = {503: {"description": "an alert's action failed (listed in `failed`): Alertmanager delivers again",
                      "content": {"application/json": {}}}}


class PolicySwitch(BaseModel):
    """Either the name of a shipped policy, or a whole policy document."""
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = None
    policy: dict | None = None

    @model_validator(mode="after")
    def _one(self) -> PolicySwitch:
        if (self.name is None) == (self.policy is None) or len(self.model_fields_set) != 1:
            raise ValueError("give exactly one of 'name' (a shipped policy) or 'policy' (a policy document)")
        return self


POLICY_SWITCH = {"type": "object", "additionalProperties": False, "oneOf": [{"required": ["name"]},
                                                                            {"required": ["policy"]}],
                 "properties": {"name": {"type": "string", "enum": shipped_policies()},
                                "policy": {"$ref": "#/components/schemas/Policy"}}}


def leader_guard(lease: Lease | None):
    """A dependency that refuses (409) a write on a standby: only the lease holder acts."""
    def require_leader() -> None:
        if lease is not None and not lease.leading():
            raise APIError(409, f"this controller ({lease.holder}) is a standby; the leader is {lease.leader}: send "
                           "writes to it", kind="conflict_error")
    return require_leader


def create_admin_router(controller: Controller, intake: AlertIntake, admin_token: str | None,
                        lease: Lease | None = None) -> APIRouter:
    """Every database read and write runs in a worker thread, never on the event loop. lease: the leader lease this
    controller leads by (None: it leads alone)."""
    token = [Depends(bearer_guard(admin_token))]
    admin = [*token, Depends(leader_guard(lease))]      # writes: the token, and only on the leader
    router = APIRouter()
    store, operator = controller.store, Operator(controller)

    @router.get("/admin/window", responses={404: error("no window closed yet")})
    async def window():
        if controller.latest is None:
            raise APIError(404, "the controller has not closed a window yet", kind="not_found_error")
        return controller.latest.to_dict()

    @router.get("/admin/config")
    async def get_config():
        return controller.current.model_dump()

    @router.get("/admin/controller")
    async def state():
        leadership = {"role": "leader", "holder": None, "leader": None, "epoch": None} if lease is None \
            else lease.state()
        return {**await to_thread(controller.state), "leadership": leadership}

    @router.put("/admin/config", dependencies=admin, openapi_extra=json_body(EngineConfig),
                responses={**ERRORS, **APPLY_FAILED, **CONFLICT})
    async def pin_config(request: Request):
        try:
            config = EngineConfig.model_validate_json(await request.body(), strict=True)
            decision = await to_thread(operator.pin, config, "operator", "operator override via PUT /admin/config")
        except ValidationError as error:
            raise invalid_body(error) from error
        except ApplyFailed as error:
            raise APIError(503, str(error), kind="server_error", code="apply_failed") from error
        except EngineClientError as error:
            raise APIError(400, str(error), "body") from error
        return {"config": controller.current.model_dump(), "pinned": True, "decision": decision}

    @router.post("/admin/release", dependencies=admin, responses={**CONFLICT, **APPLY_FAILED})
    async def release():
        try:
            decision = await to_thread(operator.release, "operator released the pin via POST /admin/release")
        except ApplyFailed as error:
            raise APIError(503, str(error), kind="server_error", code="apply_failed") from error
        if decision is None:
            raise APIError(409, "no config is pinned", kind="conflict_error")
        return {"config": controller.current.model_dump(), "pinned": False, "decision": decision}

    @router.post("/admin/rollback", dependencies=admin, responses={**APPLY_FAILED, **CONFLICT})
    async def rollback():
        try:
            decision = await to_thread(operator.rollback, "operator rollback via POST /admin/rollback", lift_pin=True)
        except ApplyFailed as error:
            raise APIError(503, str(error), kind="server_error", code="apply_failed") from error
        return {"config": controller.current.model_dump(), "decision": decision}

    @router.get("/admin/decisions")
    async def decisions(limit: Page = 100, action: str | None = Query(None, max_length=32)):
        filters = {"action": action} if action else {}
        return {"decisions": await to_thread(store.decisions, limit, **filters)}

    @router.get("/admin/history")
    async def history(limit: Page = 100):
        return {"versions": await to_thread(store.config_versions, limit),
                "last_known_good": controller.last_known_good.version}

    @router.get("/admin/trials")
    async def trials(limit: Page = 100):
        return {"trials": await to_thread(store.trials, limit)}

    @router.get("/admin/alerts")
    async def alerts(limit: Page = 100):
        return {"alerts": await to_thread(store.alerts, limit)}

    @router.get("/admin/policy")
    async def get_policy():
        return {"name": controller.policy_name, "policy": controller.policy.model_dump(), "shipped": shipped_policies()}

    @router.put("/admin/policy", dependencies=admin, responses={**ERRORS, **CONFLICT},
                openapi_extra=json_body(POLICY_SWITCH, Policy))
    async def switch_policy(request: Request):
        try:
            body = PolicySwitch.model_validate_json(await request.body())
            if body.name is not None:
                if body.name not in shipped_policies():
                    raise APIError(400, f"name: unknown policy {body.name!r}; shipped: "
                                   f"{', '.join(shipped_policies())}", "name")
                policy, name = load_policy(body.name), body.name
            else:
                policy, name = parse_policy(body.policy, "policy"), "custom"
        except ValidationError as error:
            raise invalid_body(error) from error
        except PolicyError as error:
            raise APIError(400, str(error), error.field) from error
        decision = await to_thread(operator.switch_policy, policy, name)
        return {"name": name, "decision": decision}

    def switched(decision: int | None, refusal: str) -> dict:
        if decision is None:
            raise APIError(409, f"{refusal} (policy {controller.policy_name})", kind="conflict_error")
        return {"name": controller.policy_name, "decision": decision}

    @router.post("/admin/search/start", dependencies=admin, responses=CONFLICT)
    async def start_search():
        return switched(await to_thread(operator.start_search, load_policy("optuna"), "optuna"),
                        "an Optuna search is already running")

    @router.post("/admin/search/stop", dependencies=admin, responses=CONFLICT)
    async def stop_search():
        return switched(await to_thread(operator.stop_search, load_policy("default"), "default"),
                        "no Optuna search is running")

    @router.post("/alerts", dependencies=token, responses={**ERRORS, **ALERT_FAILED})
    async def receive_alerts(payload: AlertmanagerPayload):
        """5xx while any alert's action failed, so that Alertmanager delivers the notification again."""
        outcome = await to_thread(intake.receive, payload)
        if outcome["failed"]:
            return JSONResponse(status_code=503, content=outcome)
        return outcome

    return router
