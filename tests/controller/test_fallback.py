"""Fallback to plain decoding when speculation's measured gain over plain misses the policy threshold, decided on
probe windows of both modes, and no flapping back under stationary traffic (re-enable needs min_gain + hysteresis)."""
import time

from controller.store import Decision, Trial
from tests.controller.conftest import fast_policy
from tests.controller.traffic import ClosedLoopTraffic

WINDOWS = 10


def _run(engine, controller, prompts, windows=WINDOWS):
    with ClosedLoopTraffic(engine, prompts, concurrency=4):
        engine.snapshot()
        for _ in range(windows):
            time.sleep(controller.policy.window.seconds)
            controller.tick()


def test_speculation_falls_back_once_when_it_cannot_meet_the_threshold_and_does_not_flap(build, prompts):
    # Speculation on this model is worth ~1.2-1.6x over plain; a threshold of 50x is one it cannot meet.
    policy = fast_policy(speculation={"min_gain": 50.0, "hysteresis": 0.05, "reprobe_windows": 2})
    engine, controller = build(policy, k=3)
    _run(engine, controller, prompts)
    store = controller.store
    fallbacks, reenables = store.rows(Decision, action="fallback"), store.rows(Decision, action="reenable")
    probes = store.rows(Trial, policy="rules")
    assert len(fallbacks) == 1 and not reenables
    assert controller.current.speculative_len == 0 and controller.last_known_good.speculative_len == 0
    measured = fallbacks[0]["inputs"]["speculation_gain_over_plain"]
    assert measured < 50.0
    assert fallbacks[0]["inputs"]["baseline"]["draft_len"] == 3 and fallbacks[0]["inputs"]["trial"]["draft_len"] == 0
    later = [t for t in probes if t["id"] > fallbacks[0]["trial_id"]]
    assert later and all(t["outcome"] in ("reverted", "inconclusive") for t in later), later


def test_speculation_that_pays_stays_on(build, prompts):
    # min_gain 1.0: speculation only has to be no slower than plain decoding; here it is ~1.2-1.6x faster.
    policy = fast_policy(speculation={"min_gain": 1.0, "reprobe_windows": 2})
    engine, controller = build(policy, k=3)
    _run(engine, controller, prompts, windows=6)
    store = controller.store
    probes = [t for t in store.rows(Decision, action="revert") if t["inputs"]["kind"] == "fallback_probe"]
    assert probes and not store.rows(Decision, action="fallback")
    assert all(p["inputs"]["speculation_gain_over_plain"] >= 1.0 for p in probes)
    assert controller.current.speculative_len > 0
