"""The Optuna study in RDB storage beside the store, on both backends (SQLite and a real PostgreSQL server): what a
search told survives a restart, and a trial left running by a dead process is failed, never counted."""
import optuna
from optuna.trial import TrialState

from controller.decide.optuna_search import OptunaSearch
from controller.store import Store
from policies import parse_policy
from seam import EngineConfig, LatencySummary, Window
from tests.controller.conftest import fast_policy

EMPTY = LatencySummary.of([])


def _window(tokens: int, seconds: float) -> Window:
    return Window(
        start=0.0, end=1.0, config_version=1, spec_method="draft_model", draft_len=2, steps=100, num_drafts=0,
        drafted_tokens=0, accepted_tokens=0, drafted_per_position=[], accepted_per_position=[], emitted_tokens=tokens,
        prefill_tokens=0, finished_requests=5, target_forward_seconds=seconds, draft_forward_seconds=0.0,
        step_seconds=seconds, ttft_seconds=EMPTY, inter_token_seconds=EMPTY, e2e_seconds=EMPTY, batch_size_mean=4.0,
        batch_size_max=4, queue_depth_mean=0.0, queue_depth_max=0, expert_tokens=None)


POLICY = parse_policy({**fast_policy(), "kind": "optuna", "optuna": {
    "study_name": "storage", "budget_trials": 3, "sampler": "random", "seed": 1,
    "search_space": {"draft_len": {"low": 0, "high": 6}}}}, "optuna-storage")


def test_the_study_lives_beside_the_store_and_resumes_after_a_restart(store_url):
    store = Store(store_url)        # the store's tables first, then the study's, in one database
    current = store.record_config(EngineConfig(draft_len=2), "engine", "start")
    first = OptunaSearch(POLICY, store.url)
    told = first.propose(current, _window(100, 1.0), 1)
    first.finished(told, "kept", _window(300, 1.5), 2)
    first.propose(current, _window(100, 1.0), 3)      # left running: the process dies here

    second = OptunaSearch(POLICY, store.url)           # the restart
    assert second.finished_trials == 1
    study = optuna.load_study(study_name="storage", storage=store_url)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert study.trials[0].value == 200.0 and study.trials[0].params == told.optuna_trial.params
    assert store.config(current.version) == current
