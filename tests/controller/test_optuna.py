"""The Optuna policy: the whole space (drafter, k per batch band, capacity factor on MoE targets), trials in RDB
storage on the controller's database, a search that resumes after a restart, and an SLO-breaking trial cut short
with the previous config restored at once."""
import time

import optuna
import pytest
from optuna.trial import FixedTrial, TrialState

from controller.decide.optuna_search import suggested_config
from controller.store import Decision, Trial
from policies import SearchSpace
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.controller.traffic import ClosedLoopTraffic


def _optuna_policy(budget: int, **sections) -> dict:
    return {**fast_policy(**sections), "kind": "optuna",
            "optuna": {"study_name": "test", "budget_trials": budget, "sampler": "random", "seed": 1,
                       "search_space": SPACE}}


SPACE = {"spec_method": ["draft_model", "ngram", "off"], "draft_len": {"low": 0, "high": 6}, "batch_bands": [1, 4],
         "capacity_factor": {"low": 1.0, "high": 2.0}}
K_PARAMS = {"k_batch_le_1", "k_batch_le_4", "k_batch_gt_4"}


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
    assert all(t.params["spec_method"] in SPACE["spec_method"] and 1.0 <= t.params["capacity_factor"] <= 2.0
               for t in study.trials)                 # the shipped target is MoE: the capacity factor is searched
    drafting = [t for t in study.trials if t.params["spec_method"] != "off"]
    assert drafting and all(K_PARAMS <= set(t.params) and all(t.params[k] in range(7) for k in K_PARAMS)
                            for t in drafting)
    rows = sorted(third.store.rows(Trial), key=lambda r: r["id"])
    assert [r["optuna_trial"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[2]["outcome"] == "interrupted"
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert all(t.value > 0 for t in complete)


def test_slo_breaking_trial_is_cut_short_and_the_previous_config_restored(build, prompts, monkeypatch):
    # The candidate's steps are made slow (a fault injected for any config but the baseline): its blocks break a
    # 0.2 s inter-token SLO that the incumbent's blocks meet, pair after pair, and a check of the trial ends it once
    # that is significant (7 block pairs at the earliest), well before the judge's first look.
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
    _tick_until(engine, controller, prompts, lambda: controller.state()["trial"] is None, max_ticks=20)
    cut = controller.store.rows(Decision, action="cut_short")
    assert len(cut) == 1 and "inter-token p99" in cut[0]["reason"] and "signed-rank p = " in cut[0]["reason"]
    assert controller.current == baseline and engine.config == baseline
    trial = controller.strategy.study.trials[0]
    assert trial.state == TrialState.PRUNED and trial.constraints["slo_excess_seconds"] > 0


@pytest.mark.parametrize(("params", "moe", "expected"), [
    ({"spec_method": "ngram", "k_batch_le_1": 6, "k_batch_le_4": 3, "k_batch_gt_4": 0, "capacity_factor": 1.5}, True,
     {"spec_method": "ngram", "draft_len_schedule": ((1, 6), (4, 3), (5, 0)), "capacity_factor": 1.5}),
    ({"spec_method": "draft_model", "k_batch_le_1": 2, "k_batch_le_4": 2, "k_batch_gt_4": 1}, False,
     {"spec_method": "draft_model", "draft_len_schedule": ((1, 2), (4, 2), (5, 1)), "capacity_factor": 0.0}),
    ({"spec_method": "off", "capacity_factor": 2.0}, True, {"spec_method": "off", "capacity_factor": 2.0}),
])
def test_a_trial_suggests_the_drafter_k_per_band_and_on_moe_the_capacity_factor(params, moe, expected):
    space = SearchSpace.model_validate(SPACE)
    trial = FixedTrial(params)
    config = EngineConfig().changed(**suggested_config(trial, space, moe=moe))
    assert {name: getattr(config, name) for name in expected} == expected
    assert set(trial.params) == set(params)          # every dimension the config needs was suggested, no other


def test_without_bands_one_k_is_searched():
    space = SearchSpace.model_validate({**SPACE, "batch_bands": []})
    config = EngineConfig().changed(**suggested_config(FixedTrial({"spec_method": "ngram", "draft_len": 5}), space,
                                                       moe=False))
    assert (config.spec_method, config.draft_len, config.draft_len_schedule) == ("ngram", 5, None)
