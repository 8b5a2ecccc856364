"""Alert intake: Alertmanager webhook payloads (version 4) and the built-in SLO evaluator's alerts, mapped to
controller actions, at least once with an exactly-once effect: each notification (fingerprint, startsAt, status) is
recorded, and the outcome of its action is stored in the same transaction as the decision it made. A redelivery
whose action succeeded (or was skipped, with its reason) is a no-op; one whose action failed or never ran (a kill -9
between recording and acting) is acted on.

Pins against alerts: while a pin holds (an operator's or another alert's), an alert's config-changing action
(rollback, disable_speculation, pin) is not taken; it is recorded as a `skip` decision naming the pin. The pin's
owner decides what runs; a resolved alert releases only the pin it owns.

A standby controller (controller/operate/lease.py) acts on nothing: it records each notification as `deferred`, and the
leader acts on deferred notifications at its next tick, so an alert delivered to either process acts once."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, field_validator

from controller.clients import EngineClientError
from controller.loop import Controller
from controller.operate.actions import Operator, PinHeld
from controller.store import SETTLED
from policies import AlertAction
from seam.http import Text, no_lone_surrogates

ACTIONS: tuple[str, ...] = AlertAction.__args__
BUILTIN_ALERT = "GovernorSLOBreach"
MAX_LABELS = 64


def _bounded(max_length: int):
    return Annotated[str, StringConstraints(max_length=max_length), AfterValidator(no_lone_surrogates)]


LabelName = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(no_lone_surrogates)]
Labels = Annotated[dict[LabelName, _bounded(1024)], Field(max_length=MAX_LABELS)]
Annotations = Annotated[dict[LabelName, _bounded(8192)], Field(max_length=MAX_LABELS)]
_LABEL_VALUE = {"type": "string", "maxLength": 1024}
AlertLabels = Annotated[Labels, WithJsonSchema({
    "type": "object", "maxProperties": MAX_LABELS, "propertyNames": {"minLength": 1, "maxLength": 128},
    "additionalProperties": _LABEL_VALUE, "required": ["alertname"],
    "properties": {"alertname": {**_LABEL_VALUE, "minLength": 1}, "governor_action": {"enum": list(ACTIONS)}}})]


class Alert(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    status: Literal["firing", "resolved"]
    labels: AlertLabels
    annotations: Annotations = Field(default_factory=dict)
    startsAt: _bounded(64) = Field(min_length=1)
    endsAt: _bounded(64) | None = None
    generatorURL: _bounded(2048) = ""
    fingerprint: _bounded(128) = Field(min_length=1)

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        if not labels.get("alertname"):
            raise ValueError("must contain a non-empty 'alertname'")
        action = labels.get("governor_action")
        if action is not None and action not in ACTIONS:
            raise ValueError(f"governor_action {action!r} is not one of {', '.join(ACTIONS)}")
        return labels


class AlertmanagerPayload(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    version: Literal["4"]
    groupKey: Text
    truncatedAlerts: int = Field(0, ge=0)
    status: Literal["firing", "resolved"]
    receiver: Text
    groupLabels: Labels = Field(default_factory=dict)
    commonLabels: Labels = Field(default_factory=dict)
    commonAnnotations: Annotations = Field(default_factory=dict)
    externalURL: Text = ""
    alerts: list[Alert] = Field(min_length=1, max_length=1000)


class AlertIntake:
    def __init__(self, controller: Controller, leading: Callable[[], bool] = lambda: True):
        self.controller, self.operator, self.leading = controller, Operator(controller), leading
        controller.alerts = self

    def action_for(self, alert: Alert) -> str:
        policy = self.controller.policy.alerts
        name = alert.labels["alertname"]
        return policy.overrides.get(name) or alert.labels.get("governor_action") or policy.default_action

    def receive(self, payload: AlertmanagerPayload, source: str = "alertmanager") -> dict:
        """failed lists the alerts whose action did not succeed: answer 5xx so that Alertmanager delivers again."""
        outcome = {"received": len(payload.alerts), "acted": [], "skipped": [], "failed": [], "deferred": [],
                   "duplicates": 0, "resolved": 0}
        for alert in payload.alerts:
            result = self._one(alert, source)
            if result is None:
                outcome["duplicates"] += 1
            elif result["outcome"] in ("skipped", "failed", "deferred"):
                outcome[result["outcome"]].append(result)
            elif alert.status == "resolved":
                outcome["resolved"] += 1
            else:
                outcome["acted"].append(result)
        return outcome

    def act_on_deferred(self) -> int:
        """The leader's part: act on the notifications standbys deferred to it; returns how many it took up."""
        rows = self.controller.store.deferred_alerts()
        for row in rows:
            alert = Alert(status=row["status"], labels=row["labels"], annotations=row["annotations"],
                          startsAt=row["starts_at"], fingerprint=row["fingerprint"])
            self._one(alert, row["source"])
        return len(rows)

    def builtin(self, status: str, starts_at: str, summary: str, action: str = "rollback") -> None:
        """The built-in SLO evaluator's alert, for when no Prometheus runs."""
        fingerprint = hashlib.sha1(f"{BUILTIN_ALERT}:{starts_at}".encode()).hexdigest()[:16]
        alert = Alert(status=status, labels={"alertname": BUILTIN_ALERT, "governor_action": action},
                      annotations={"summary": summary}, startsAt=starts_at, fingerprint=fingerprint)
        self._one(alert, "builtin")

    def _one(self, alert: Alert, source: str) -> dict | None:
        """Act on one notification unless its action already succeeded (None: a duplicate, answered as such)."""
        controller, name, action = self.controller, alert.labels["alertname"], self.action_for(alert)
        with controller.lock:
            alert_id, settled = controller.store.record_alert(
                fingerprint=alert.fingerprint, starts_at=alert.startsAt, status=alert.status, name=name,
                action=action, labels=alert.labels, annotations=alert.annotations, source=source)
            if settled in SETTLED:
                return None
            result = {"alert": name, "fingerprint": alert.fingerprint,
                      "action": "resolved" if alert.status == "resolved" else action}
            if not self.leading():
                detail = "received by a standby controller: the leader acts on it at its next tick"
                controller.store.defer_alert(alert_id, detail)
                return {**result, "outcome": "deferred", "reason": detail}
            try:
                decision = self._act(alert, name, action, alert_id, source)
            except PinHeld as held:
                decision = self.operator.skip(f"alert {name} firing: {action} skipped: {held}",
                                           self._inputs(alert, name, source), alert_id)
                return {**result, "outcome": "skipped", "reason": str(held), "decision": decision}
            except EngineClientError as error:
                controller.store.settle_alert(alert_id, "failed", str(error))
                return {**result, "outcome": "failed", "reason": str(error)}
            if decision is None:
                detail = f"alert {name} resolved: it owns no pin, nothing to release"
                controller.store.settle_alert(alert_id, "skipped", detail)
                return {**result, "outcome": "resolved", "reason": detail}
            return {**result, "outcome": "acted", "decision": decision}

    def _act(self, alert: Alert, name: str, action: str, alert_id: int, source: str) -> int | None:
        owner = f"alert:{alert.fingerprint}"
        if alert.status == "resolved":
            return self.operator.release(f"alert {name} resolved", owner=owner, alert=alert_id)
        reason = f"alert {name} firing: {action}"
        if action == "rollback":
            return self.operator.rollback(reason, self._inputs(alert, name, source), alert=alert_id)
        if action == "disable_speculation":
            return self.operator.disable_speculation(owner, reason, alert=alert_id)
        if action == "pin":
            self.operator.refuse_if_pinned()
            return self.operator.pin(None, owner, reason, alert=alert_id)
        return self.operator.notify(reason, self._inputs(alert, name, source), alert=alert_id)

    @staticmethod
    def _inputs(alert: Alert, name: str, source: str) -> dict:
        return {"alert": name, "fingerprint": alert.fingerprint, "startsAt": alert.startsAt, "source": source,
                "annotations": alert.annotations}
