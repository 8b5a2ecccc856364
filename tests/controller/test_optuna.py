"""The Optuna policy: trials in RDB storage on the controller's database, a search that resumes after a restart,
and an SLO-breaking trial cut short with the previous config restored at once."""
import time

import optuna
from optuna.trial import TrialState

from controller.store import Decision, Trial
from tests.controller.conftest import fast_policy
from tests.controller.traffic import ClosedLoopTraffic


def _optuna_policy(budget: int, **sections) -> dict:
    return {**fast_policy(**sections), "kind": "optuna",
            "optuna": {"study_name": "test", "budget_trials": budget, "sampler": "random", "seed": 1,
                       "search_space": {"draft_len": {"low": 0, "high": 6}}}}


def _tick_until(engine, controller, prompts, done, max_ticks=30):
    with ClosedLoopTraffic(engine, prompts):
        controller.client.snapshot()
        for _ in range(max_ticks):
            if done():
                return
            time.sleep(controller.policy.window.seconds / controller.policy.window.checks)
            controller.tick()
    assert done()


def test_trials_live_in_the_rdb_and_the_search_resumes_after_a_restart(build, prompts, db_url):
    engine, first = build(_optuna_policy(budget=2), k=3)
    _tick_until(engine, first, prompts, lambda: first.strategy.finished_trials == 2)
    _tick_until(engine, first, prompts, lambda: first.state()["trial"] is None and first.window_index >= 6)
    assert first.strategy.finished_trials == 2         # the budget is spent: no third trial

    engine, second = build(_optuna_policy(budget=4), k=3)      # a restart on the same database, larger budget
    _tick_until(engine, second, prompts, lambda: second.state()["trial"] is not None)
    # ... and another restart while that trial runs: the interrupted trial is failed, never counted
    engine, third = build(_optuna_policy(budget=4), k=3)
    _tick_until(engine, third, prompts, lambda: third.strategy.finished_trials == 4)

    study = optuna.load_study(study_name="test", storage=db_url)
    states = [t.state for t in study.trials]
    assert states.count(TrialState.FAIL) == 1 and len(states) == 5
    assert all(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states[:2] + states[3:])
    assert all(t.params["draft_len"] in range(7) for t in study.trials)
    rows = sorted(third.store.rows(Trial), key=lambda r: r["id"])
    assert [r["optuna_trial"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[2]["outcome"] == "interrupted"
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert all(t.value > 0 for t in complete)


def test_slo_breaking_trial_is_cut_short_and_the_previous_config_restored(build, prompts, monkeypatch):
    # The candidate's steps are made slow (a fault injected for any config but the baseline): its blocks break a
    # 0.2 s inter-token SLO that the incumbent's blocks meet, and the first partial window of the trial ends it.
    policy = _optuna_policy(budget=5, window={"seconds": 2.0, "checks": 4},
                            slo={"inter_token_p99_seconds": 0.2, "builtin_evaluator": False})
    engine, controller = build(policy, k=3)
    baseline = controller.current
    forward = engine.target.forward

    def slow_candidate(*args, **kwargs):
        if engine.config.version != baseline.version:
            time.sleep(0.3)
        return forward(*args, **kwargs)
    monkeypatch.setattr(engine.target, "forward", slow_candidate)
    _tick_until(engine, controller, prompts, lambda: controller.state()["trial"] is not None)
    with ClosedLoopTraffic(engine, prompts):
        time.sleep(1.5)
        controller.tick()                    # a few checks, each a quarter of the window
        time.sleep(0.5)
        controller.tick()
    assert controller.state()["trial"] is None
    cut = controller.store.rows(Decision, action="cut_short")
    assert len(cut) == 1 and "inter-token p99" in cut[0]["reason"]
    assert controller.current == baseline and engine.config == baseline
    trial = controller.strategy.study.trials[0]
    assert trial.state == TrialState.PRUNED and trial.constraints["slo_excess_seconds"] > 0
