"""Alert intake: Alertmanager webhook payloads (version 4) and the built-in SLO evaluator's alerts, mapped to
controller actions. One (fingerprint, startsAt) acts once however often it is delivered; resolved ones are recorded."""
from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema,
                      field_validator)

from controller.loop import Controller
from engine.api_schema import Text, no_lone_surrogates
from policies import AlertAction

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
    def __init__(self, controller: Controller):
        self.controller = controller
        controller.alerts = self

    def action_for(self, alert: Alert) -> str:
        policy = self.controller.policy.alerts
        name = alert.labels["alertname"]
        return policy.overrides.get(name) or alert.labels.get("governor_action") or policy.default_action

    def receive(self, payload: AlertmanagerPayload, source: str = "alertmanager") -> dict:
        outcome = {"received": len(payload.alerts), "acted": [], "duplicates": 0, "resolved": 0}
        for alert in payload.alerts:
            result = self._one(alert, source)
            if result is None:
                outcome["duplicates"] += 1
            elif alert.status == "resolved":
                outcome["resolved"] += 1
            else:
                outcome["acted"].append(result)
        return outcome

    def builtin(self, status: str, starts_at: str, summary: str) -> None:
        """The built-in SLO evaluator's alert, for when no Prometheus runs."""
        fingerprint = hashlib.sha1(f"{BUILTIN_ALERT}:{starts_at}".encode()).hexdigest()[:16]
        alert = Alert(status=status, labels={"alertname": BUILTIN_ALERT, "governor_action": "rollback"},
                      annotations={"summary": summary}, startsAt=starts_at, fingerprint=fingerprint)
        self._one(alert, "builtin")

    def _one(self, alert: Alert, source: str) -> dict | None:
        controller, name, action = self.controller, alert.labels["alertname"], self.action_for(alert)
        with controller.lock:
            fresh = controller.store.record_alert(
                fingerprint=alert.fingerprint, starts_at=alert.startsAt, status=alert.status, name=name,
                action=action, labels=alert.labels, annotations=alert.annotations, source=source)
            if not fresh:
                return None
            owner = f"alert:{alert.fingerprint}"
            inputs = {"alert": name, "fingerprint": alert.fingerprint, "startsAt": alert.startsAt, "source": source,
                      "annotations": alert.annotations}
            if alert.status == "resolved":
                controller.release(f"alert {name} resolved", owner=owner)
                return {"alert": name, "fingerprint": alert.fingerprint, "action": "resolved"}
            reason = f"alert {name} firing: {action}"
            if action == "rollback":
                decision = controller.rollback(reason, inputs)
            elif action == "disable_speculation":
                decision = controller.disable_speculation(owner, reason)
            elif action == "pin":
                decision = controller.pin(None, owner, reason)
            else:
                decision = controller.notify(reason, inputs)
            return {"alert": name, "fingerprint": alert.fingerprint, "action": action, "decision": decision}
