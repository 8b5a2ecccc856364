"""An injected regression: a deploy outside the controller switches the engine to a config whose target forward is
slow (a fault injected for draft_len 8 only). The built-in SLO evaluator raises one alert, the controller rolls back
to the last known good once, latency recovers and the alert resolves."""
import time

import pytest

from controller.alerts import BUILTIN_ALERT, AlertIntake
from controller.store import AlertRecord, Decision, Rollback
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.controller.traffic import ClosedLoopTraffic

BAD_DRAFT_LEN, FAULT_SECONDS, SLO_SECONDS = 8, 0.4, 0.3


@pytest.fixture
def slow_when_bad(monkeypatch):
    """Make the target forward sleep FAULT_SECONDS while the engine's draft_len is BAD_DRAFT_LEN."""
    def inject(engine):
        forward = engine.target.forward

        def slow_forward(*args, **kwargs):
            if engine.config.draft_len == BAD_DRAFT_LEN:
                time.sleep(FAULT_SECONDS)
            return forward(*args, **kwargs)
        monkeypatch.setattr(engine.target, "forward", slow_forward)
    return inject


def _windows(engine, controller, count):
    for _ in range(count):
        time.sleep(controller.policy.window.seconds)
        controller.tick()


def test_bad_deploy_fires_the_slo_alert_and_rolls_back_once_to_the_last_known_good(build, prompts, slow_when_bad):
    policy = fast_policy(window={"seconds": 2.0, "min_emitted_tokens": 10, "min_steps": 2},
                         slo={"inter_token_p99_seconds": SLO_SECONDS, "ttft_p99_seconds": 60.0},
                         trial={"min_predicted_gain": 100.0})
    engine, controller = build(policy, k=3)
    AlertIntake(controller)
    slow_when_bad(engine)
    good = controller.last_known_good
    with ClosedLoopTraffic(engine, prompts, concurrency=4):
        engine.snapshot()
        _windows(engine, controller, 2)
        assert controller.store.count(AlertRecord) == 0 and controller.latest.draft_len == 3

        engine.apply(EngineConfig(spec_method="draft_model", draft_len=BAD_DRAFT_LEN, version=good.version + 100))
        for _ in range(4):
            _windows(engine, controller, 1)
            if controller.store.count(Decision, action="rollback"):
                break
        rollbacks = controller.store.rows(Decision, action="rollback")
        assert len(rollbacks) == 1, controller.store.rows(Decision)
        assert rollbacks[0]["reason"] == f"alert {BUILTIN_ALERT} firing: rollback"
        assert rollbacks[0]["inputs"]["source"] == "builtin" and rollbacks[0]["config_version"] == good.version

        _windows(engine, controller, 3)
    assert engine.config == good
    assert controller.latest.draft_len == 3 and controller.latest.inter_token_seconds.p99 <= SLO_SECONDS
    alerts = [(a["name"], a["status"]) for a in controller.store.rows(AlertRecord)]
    assert sorted(alerts) == [(BUILTIN_ALERT, "firing"), (BUILTIN_ALERT, "resolved")]
    assert controller.store.count(Decision, action="rollback") == 1 and controller.store.count(Rollback) == 1
