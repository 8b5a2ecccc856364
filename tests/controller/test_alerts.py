"""POST /alerts with Alertmanager webhook payloads on a real loopback server: token, validation, idempotence per
fingerprint, the action map, and the built-in SLO evaluator."""
import copy
import threading
import time

import httpx
import pytest

from controller.clients import InProcessClient
from controller.operate.actions import Operator
from controller.plane import build_control_plane
from controller.store import AlertOutcome, AlertRecord, Decision, Rollback
from engine.server.service import EngineService
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.controller.server import AUTH, TOKEN, serving
from tests.controller.traffic import ClosedLoopTraffic
from tests.engine.helpers import make_engine

PAYLOAD = {
    "version": "4", "groupKey": "{}:{alertname=\"GovernorHighInterTokenLatency\"}", "truncatedAlerts": 0,
    "status": "firing", "receiver": "governor", "groupLabels": {"alertname": "GovernorHighInterTokenLatency"},
    "commonLabels": {"alertname": "GovernorHighInterTokenLatency", "governor_action": "rollback"},
    "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
    "alerts": [{"status": "firing",
                "labels": {"alertname": "GovernorHighInterTokenLatency", "governor_action": "rollback"},
                "annotations": {"summary": "p99 inter-token latency above 0.5 s"},
                "startsAt": "2026-12-02T22:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph", "fingerprint": "5a1b2c3d4e5f6071"}],
}


def _payload(status="firing", action="rollback", fingerprint="5a1b2c3d4e5f6071", name="GovernorHighInterTokenLatency"):
    payload = copy.deepcopy(PAYLOAD)
    payload["status"] = status
    alert = payload["alerts"][0]
    alert.update(status=status, fingerprint=fingerprint)
    alert["labels"] = {"alertname": name, "governor_action": action}
    return payload


@pytest.fixture
def served(moe_models, tmp_path):
    """(url, controller, write_policy): a served engine + controller whose policy file the test may set first."""
    def start(policy: dict | None = None):
        import yaml
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(policy or fast_policy()))
        service = EngineService(make_engine(moe_models, EngineConfig(draft_len=3)))
        plane = build_control_plane(InProcessClient(service.engine), str(path), f"sqlite:///{tmp_path / 'g.db'}",
                                    TOKEN)
        return serving(service, plane), plane.controller
    return start


def _rollbacks(controller) -> int:
    return controller.store.count(Decision, action="rollback")


def test_firing_rollback_alert_records_one_rollback_even_at_the_last_known_good(served):
    context, controller = served()
    with context as url:
        assert controller.current == controller.last_known_good
        reply = httpx.post(f"{url}/alerts", json=_payload(), headers=AUTH)
        assert reply.status_code == 200, reply.text
        assert reply.json()["acted"][0]["action"] == "rollback"
        for _ in range(3):   # Alertmanager resends the same notification
            assert httpx.post(f"{url}/alerts", json=_payload(), headers=AUTH).json()["duplicates"] == 1
    assert _rollbacks(controller) == 1
    assert controller.store.count(Rollback) == 1
    assert controller.metrics.rollbacks == 1 and controller.metrics.decisions["rollback"] == 1


def test_duplicates_inside_one_payload_act_once_and_a_new_firing_acts_again(served):
    context, controller = served()
    payload = _payload()
    payload["alerts"].append(copy.deepcopy(payload["alerts"][0]))
    with context as url:
        body = httpx.post(f"{url}/alerts", json=payload, headers=AUTH).json()
        assert (len(body["acted"]), body["duplicates"]) == (1, 1)
        again = _payload()
        again["alerts"][0]["startsAt"] = "2026-12-02T23:00:00Z"    # the same alert, firing anew later
        assert len(httpx.post(f"{url}/alerts", json=again, headers=AUTH).json()["acted"]) == 1
    assert _rollbacks(controller) == 2


def test_resolved_is_recorded_without_acting(served):
    context, controller = served()
    with context as url:
        httpx.post(f"{url}/alerts", json=_payload(), headers=AUTH)
        body = httpx.post(f"{url}/alerts", json=_payload(status="resolved"), headers=AUTH).json()
        assert body["resolved"] == 1 and not body["acted"]
    statuses = sorted(a["status"] for a in controller.store.rows(AlertRecord))
    assert statuses == ["firing", "resolved"]
    assert _rollbacks(controller) == 1


def test_alert_without_token_is_401_and_records_nothing(served):
    context, controller = served()
    with context as url:
        assert httpx.post(f"{url}/alerts", json=_payload()).status_code == 401
        wrong = httpx.post(f"{url}/alerts", json=_payload(), headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["type"] == "authentication_error"
    assert controller.store.count(AlertRecord) == 0 and _rollbacks(controller) == 0


@pytest.mark.parametrize("mutate, field", [
    (lambda p: p.update(version="3"), "version"),
    (lambda p: p["alerts"][0].pop("fingerprint"), "alerts.0.fingerprint"),
    (lambda p: p["alerts"][0]["labels"].update(governor_action="reboot"), "alerts.0.labels"),
    (lambda p: p["alerts"][0]["labels"].pop("alertname"), "alerts.0.labels"),
    (lambda p: p.update(alerts=[]), "alerts"),
    (lambda p: p["alerts"][0].update(status="pending"), "alerts.0.status"),
])
def test_bad_payload_is_400_naming_the_field_and_records_nothing(served, mutate, field):
    context, controller = served()
    payload = _payload()
    mutate(payload)
    with context as url:
        reply = httpx.post(f"{url}/alerts", json=payload, headers=AUTH)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == field
    assert controller.store.count(AlertRecord) == 0 and controller.store.count(Decision, action="rollback") == 0


def test_policy_overrides_the_alerts_action_by_name(served):
    context, controller = served(fast_policy(alerts={"overrides": {"GovernorHighInterTokenLatency": "notify"}}))
    with context as url:
        body = httpx.post(f"{url}/alerts", json=_payload(action="rollback"), headers=AUTH).json()
    assert body["acted"][0]["action"] == "notify"
    assert _rollbacks(controller) == 0 and controller.store.count(Decision, action="notify") == 1


def test_disable_speculation_pins_plain_decoding_until_the_alert_resolves(served):
    context, controller = served()
    good = controller.last_known_good
    with context as url:
        httpx.post(f"{url}/alerts", json=_payload(action="disable_speculation", fingerprint="f00d"), headers=AUTH)
        assert httpx.get(f"{url}/admin/config").json()["spec_method"] == "off"
        assert httpx.get(f"{url}/admin/controller").json()["pin"]["owner"] == "alert:f00d"
        httpx.post(f"{url}/alerts", json=_payload(status="resolved", action="disable_speculation",
                                                  fingerprint="f00d"), headers=AUTH)
        state = httpx.get(f"{url}/admin/controller").json()
    # an alert's pin is never judged: its release brings the last known good back instead of adopting it
    assert state["pin"] is None and state["config"] == state["last_known_good"] == good.model_dump()
    assert controller.store.count(Decision, action="release") == 1


def _break_the_slo_for_three_windows(engine, controller, prompts) -> None:
    with ClosedLoopTraffic(engine, prompts, concurrency=4):
        controller.client.snapshot()
        for _ in range(3):
            time.sleep(controller.policy.window.seconds)
            controller.tick()


def test_a_builtin_breach_at_the_last_known_good_raises_one_alert_that_notifies(build, prompts):
    # An inter-token SLO of 1 microsecond: every window breaks it, so the built-in evaluator fires once and stays.
    # The last known good config runs, so a rollback would change nothing: the alert notifies, saying so.
    from controller.operate.alerts import AlertIntake
    engine, controller = build(fast_policy(slo={"inter_token_p99_seconds": 1e-6}, trial={"min_predicted_gain": 100.0}))
    AlertIntake(controller)
    _break_the_slo_for_three_windows(engine, controller, prompts)
    alerts = controller.store.rows(AlertRecord)
    assert [(a["name"], a["status"], a["source"], a["action"]) for a in alerts] == [
        ("GovernorSLOBreach", "firing", "builtin", "notify")]
    assert _rollbacks(controller) == 0
    notify = controller.store.rows(Decision, action="notify")
    assert len(notify) == 1 and "a rollback would change nothing" in notify[0]["inputs"]["annotations"]["summary"]


def test_a_builtin_breach_away_from_the_last_known_good_asks_for_a_rollback(build, prompts):
    # An operator's pin holds another config than the last known good: the alert asks for a rollback, which the pin
    # skips (a pin wins), recorded with the pin named.
    from controller.operate.alerts import AlertIntake
    engine, controller = build(fast_policy(slo={"inter_token_p99_seconds": 1e-6}, trial={"min_predicted_gain": 100.0}))
    AlertIntake(controller)
    Operator(controller).pin(controller.current.changed(draft_len=2), "operator", "hold k 2")
    _break_the_slo_for_three_windows(engine, controller, prompts)
    alerts = controller.store.rows(AlertRecord)
    assert [(a["name"], a["action"]) for a in alerts] == [("GovernorSLOBreach", "rollback")]
    assert [o["outcome"] for o in controller.store.rows(AlertOutcome)] == ["skipped"]
    skip = controller.store.rows(Decision, action="skip")
    assert len(skip) == 1 and "rollback skipped" in skip[0]["reason"] and "operator" in skip[0]["reason"]
    assert _rollbacks(controller) == 0 and controller.current.draft_len == 2


def test_a_builtin_breach_the_incumbents_blocks_share_during_a_trial_notifies_and_the_trial_goes_on(
        build, prompts, monkeypatch):
    # Once a trial of k (2 against the model's best) runs, every target forward takes 0.45 s more, on both arms: a
    # step's tokens come at least 0.15 s apart on either, over the SLO. The breach is not the candidate's doing, so
    # the alert notifies instead of rolling back, and the trial runs on.
    from controller.operate.alerts import AlertIntake
    engine, controller = build(fast_policy(slo={"inter_token_p99_seconds": 0.15},
                                           window={"seconds": 3.0, "min_steps": 3, "min_emitted_tokens": 10}), k=2)
    AlertIntake(controller)
    slow, forward = threading.Event(), engine.target.forward

    def slow_once_a_trial_runs(*args, **kwargs):
        if slow.is_set():
            time.sleep(0.45)
        return forward(*args, **kwargs)
    monkeypatch.setattr(engine.target, "forward", slow_once_a_trial_runs)
    with ClosedLoopTraffic(engine, prompts, concurrency=4):
        controller.client.snapshot()
        for _ in range(10):
            time.sleep(controller.policy.window.seconds)
            controller.tick()
            if controller.state()["trial"] is not None:
                slow.set()
            if controller.store.rows(AlertRecord):
                break
        trial = controller.state()["trial"]
    alerts = controller.store.rows(AlertRecord)
    assert [(a["name"], a["action"]) for a in alerts] == [("GovernorSLOBreach", "notify")]
    assert _rollbacks(controller) == 0 and trial is not None                # the trial was not ended by the alert
    notify = controller.store.rows(Decision, action="notify")
    assert len(notify) == 1 and "the traffic's, not the trial's" in notify[0]["inputs"]["annotations"]["summary"]
