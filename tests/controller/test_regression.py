"""An injected regression: a deploy outside the controller switches the engine to a config whose target forward is
slow (a fault injected for draft_len 8 only). The controller sees the engine serve a version it does not hold,
re-applies its own config within one tick, records that once, and latency is back within the SLO. The built-in SLO
alert may also fire on the window the bad config ran in; its rollback lands on the config already restored. (That
alert's rollback is tested in test_alerts.py, the real Alertmanager's in tests/e2e/test_alert_delivery.py.)"""
import time

import pytest

from controller.operate.alerts import AlertIntake
from controller.store import AlertRecord, Decision
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


def test_a_bad_deploy_outside_the_controller_is_reapplied_away_within_one_tick(build, prompts, slow_when_bad):
    policy = fast_policy(window={"seconds": 2.0, "min_emitted_tokens": 10, "min_steps": 2},
                         slo={"inter_token_p99_seconds": SLO_SECONDS, "ttft_p99_seconds": 60.0},
                         trial={"min_predicted_gain": 100.0})
    engine, controller = build(policy, k=3)
    AlertIntake(controller)
    slow_when_bad(engine)
    good = controller.last_known_good
    with ClosedLoopTraffic(engine, prompts, concurrency=4):
        controller.client.snapshot()
        _windows(engine, controller, 2)
        assert controller.store.count(AlertRecord) == 0 and controller.latest.draft_len == 3

        engine.apply(EngineConfig(spec_method="draft_model", draft_len=BAD_DRAFT_LEN, version=good.version + 100))
        _windows(engine, controller, 1)
        reapplied = controller.store.rows(Decision, action="reapply")
        assert len(reapplied) == 1, controller.store.rows(Decision)
        assert reapplied[0]["config_version"] == good.version
        assert reapplied[0]["inputs"]["drifted"] == {"engine": good.version + 100}

        _windows(engine, controller, 3)
    assert engine.config == good
    assert controller.latest.draft_len == 3 and controller.latest.inter_token_seconds.p99 <= SLO_SECONDS
    assert controller.store.count(Decision, action="reapply") == 1
