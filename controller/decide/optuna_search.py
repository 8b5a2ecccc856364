"""The Optuna policy: ask/tell, one trial = one switchback trial of the config. Objective: tokens per busy second;
constraint: the latency SLO (a trial that breaks it is cut short by the loop and told PRUNED). Trials live in RDB
storage on the controller's own database, so a search resumes after a restart and optuna-dashboard can read it.

The space: the drafter (spec_method), k per batch band (the schedule; one k when no bands are given), and on MoE
targets the capacity factor."""
from __future__ import annotations

import optuna
from optuna.trial import TrialState

from controller.outcomes import TrialOutcome
from controller.strategy import Proposal
from controller.window_stats import tokens_per_busy_second
from policies import Policy, SearchSpace
from seam import EngineConfig, Window


class OptunaSearch:
    """A Strategy: each proposal is an Optuna trial, told its window's tokens per busy second."""
    name = "optuna"

    def __init__(self, policy: Policy, storage_url: str):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.policy = policy
        settings = policy.optuna
        sampler = {"tpe": lambda: optuna.samplers.TPESampler(seed=settings.seed),
                   "gp": lambda: optuna.samplers.GPSampler(seed=settings.seed),
                   "random": lambda: optuna.samplers.RandomSampler(seed=settings.seed)}[settings.sampler]()
        self.study = optuna.create_study(storage=storage_url, study_name=settings.study_name, direction="maximize",
                                         sampler=sampler, load_if_exists=True)
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(trial.number, state=TrialState.FAIL)   # its process ended mid-window

    @property
    def finished_trials(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))

    def observe(self, window: Window) -> None:
        pass

    def released(self, config: EngineConfig) -> None:
        pass

    def propose(self, current: EngineConfig, baseline: Window, window_index: int) -> Proposal | None:
        if self.finished_trials >= self.policy.optuna.budget_trials:
            return None
        trial = self.study.ask()
        update = suggested_config(trial, self.policy.optuna.search_space, moe=baseline.expert_tokens is not None)
        return Proposal(current.changed(**update), "optuna",
                        f"optuna trial {trial.number}: {', '.join(f'{k}={v}' for k, v in trial.params.items())}",
                        keep_gain=self.policy.trial.keep_gain, inputs={"optuna_trial": trial.number,
                                                                       "params": trial.params},
                        optuna_trial=trial)

    def finished(self, proposal: Proposal, outcome: TrialOutcome, window: Window | None, window_index: int,
                 measured_gain: float | None = None) -> None:
        trial = proposal.optuna_trial
        judged = ("kept", "reverted", "no_difference", "futile", "inconclusive")
        if window is not None and outcome in (*judged, "cut_short"):
            trial.set_constraint("slo_excess_seconds", self._slo_excess(window))   # > 0: the SLO was broken
            trial.set_user_attr("outcome", outcome)
        if window is not None and outcome in judged:
            self.study.tell(trial, tokens_per_busy_second(window))
        elif outcome == "cut_short":
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def _slo_excess(self, window: Window) -> float:
        slo = self.policy.slo
        excess = [summary.p99 - bound for summary, bound in ((window.inter_token_seconds, slo.inter_token_p99_seconds),
                                                            (window.ttft_seconds, slo.ttft_p99_seconds))
                  if bound is not None and summary.count]
        return max(excess, default=0.0)


def suggested_config(trial: optuna.Trial, space: SearchSpace, moe: bool) -> dict:
    """EngineConfig fields for one trial: spec_method, then (unless off) one k per batch band, the last band
    reaching every larger batch; capacity_factor on MoE targets when the space has a range for it."""
    method = trial.suggest_categorical("spec_method", space.spec_method)
    update: dict = {"spec_method": method}
    if method != "off" and not space.batch_bands:
        update |= {"draft_len": trial.suggest_int("draft_len", space.draft_len.low, space.draft_len.high),
                   "draft_len_schedule": None}
    elif method != "off":
        edges = [*space.batch_bands, space.batch_bands[-1] + 1]
        names = [f"k_batch_le_{edge}" for edge in space.batch_bands] + [f"k_batch_gt_{space.batch_bands[-1]}"]
        ks = [trial.suggest_int(name, space.draft_len.low, space.draft_len.high) for name in names]
        update |= {"draft_len": ks[0], "draft_len_schedule": tuple(zip(edges, ks))}
    if moe and space.capacity_factor is not None:
        update["capacity_factor"] = trial.suggest_float("capacity_factor", space.capacity_factor.low,
                                                        space.capacity_factor.high)
    return update
