"""Validate, then act: a write the engine refuses changes nothing (no version, no abandoned trial, no last known good);
an alert's pin never becomes last known good; an alert's rollback under an operator's pin is recorded as skipped,
and stays so across a restart; the per-tick drift check takes either arm of a running experiment as intended."""
import time

import pytest

from controller import Controller, InProcessClient, Store
from controller.clients import EngineClientError
from controller.operate.actions import Operator
from controller.operate.alerts import AlertIntake, AlertmanagerPayload
from controller.store import ConfigVersion, Decision, Trial
from policies import parse_policy
from tests.controller.conftest import fast_policy
from tests.controller.test_alerts import _payload
from tests.controller.traffic import GREEDY, ClosedLoopTraffic

PROBING = fast_policy(speculation={"reprobe_windows": 1}, trial={"min_predicted_gain": 100.0})


def _with_a_trial_running(engine, controller, prompts) -> None:
    with ClosedLoopTraffic(engine, prompts, concurrency=2):
        controller.client.snapshot()
        deadline = time.monotonic() + 30
        while controller.state()["trial"] is None:
            assert time.monotonic() < deadline, controller.store.rows(Decision)
            time.sleep(controller.policy.window.seconds)
            controller.tick()


def _everything(controller, engine) -> tuple:
    store = controller.store
    return (controller.current, controller.last_known_good, store.pin(), store.count(ConfigVersion),
            store.count(Decision), store.rows(Trial), controller.state()["trial"], engine.desired_config)


def test_a_pin_the_engine_refuses_changes_nothing_not_even_the_running_trial(build, prompts):
    engine, controller = build(PROBING, k=3)
    _with_a_trial_running(engine, controller, prompts)
    before = _everything(controller, engine)
    one_expert_everywhere = [[0] * 8 for _ in engine.target.moe_blocks]
    with pytest.raises(EngineClientError, match="placement"):
        Operator(controller).pin(controller.current.changed(placement=one_expert_everywhere), "operator", "refused")
    assert _everything(controller, engine) == before


def test_an_alert_disabling_speculation_mid_trial_pins_the_last_known_good_and_never_promotes_it(build, prompts):
    engine, controller = build(PROBING, k=3)
    intake = AlertIntake(controller)
    _with_a_trial_running(engine, controller, prompts)
    good = controller.last_known_good
    (trial,) = controller.store.rows(Trial)     # a switchback trial: good is its incumbent, its candidate differs
    assert controller.current == good and trial["baseline_version"] == good.version != trial["config_version"]
    intake.receive(AlertmanagerPayload.model_validate(_payload(action="disable_speculation", fingerprint="f1")))
    assert controller.current.model_dump(exclude={"version"}) == good.changed(spec_method="off").model_dump(
        exclude={"version"})
    assert controller.store.rows(Trial)[0]["outcome"] == "pinned_over"
    intake.receive(AlertmanagerPayload.model_validate(_payload(status="resolved", action="disable_speculation",
                                                               fingerprint="f1")))
    assert controller.last_known_good == good and controller.current == good and controller.store.pin() is None


def test_an_alert_rollback_under_an_operator_pin_is_recorded_as_skipped_across_a_restart(build, db_url):
    engine, controller = build(fast_policy(), k=3)
    Operator(controller).pin(controller.current.changed(draft_len=6), "operator", "hold k=6")
    pinned = controller.current
    reply = AlertIntake(controller).receive(AlertmanagerPayload.model_validate(_payload(fingerprint="f2")))
    assert [s["outcome"] for s in reply["skipped"]] == ["skipped"] and not reply["acted"]
    assert "pinned by operator" in reply["skipped"][0]["reason"]
    assert controller.current == pinned and engine.desired_config == pinned
    assert controller.store.count(Decision, action="rollback") == 0
    (skip,) = controller.store.rows(Decision, action="skip")
    assert "skipped" in skip["reason"] and skip["inputs"]["fingerprint"] == "f2"

    restarted = Controller(InProcessClient(engine), Store(db_url), parse_policy(fast_policy(), "again"))
    again = AlertIntake(restarted).receive(AlertmanagerPayload.model_validate(_payload(fingerprint="f2")))
    assert again["duplicates"] == 1
    assert restarted.current == pinned and restarted.store.count(Decision, action="rollback") == 0


def test_drift_check_leaves_a_running_experiment_alone_and_ends_it_for_a_write_behind_its_back(build, prompts):
    engine, controller = build(PROBING, k=3)
    _with_a_trial_running(engine, controller, prompts)
    good, (trial,) = controller.last_known_good, controller.store.rows(Trial)
    controller.client.snapshot()        # the blocks run so far are not this test's concern
    for step in range(200):             # step by hand until the engine serves the candidate's arm
        if engine.switchback is not None and engine.desired_config.version == trial["config_version"]:
            break
        if not engine.has_work:
            engine.add_request(f"r{step}", prompts[0], GREEDY)
        engine.step()
    assert engine.desired_config.version == trial["config_version"] != good.version
    controller.tick()
    assert controller.store.count(Decision, action="reapply") == 0 and controller.state()["trial"] is not None

    engine.apply(good.changed(draft_len=1, version=0))
    controller.tick()
    (reapplied,) = controller.store.rows(Decision, action="reapply")
    assert reapplied["inputs"] == {"drifted": {"engine": 0}, "ended_trial": trial["id"]}
    assert controller.store.rows(Trial)[0]["outcome"] == "abandoned" and controller.state()["trial"] is None
    assert controller.current == good and engine.desired_config == good
