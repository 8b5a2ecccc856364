"""The controller's vocabulary as types a checker sees: what a proposal changes, what the judge finds, how a trial
ends and what a decision records. The strings are what the store, the admin API, the metrics and the dashboard carry."""
from __future__ import annotations

from typing import Literal

ProposalKind = Literal["draft_len", "spec_method", "fallback_probe", "speculation_probe", "capacity_factor",
                       "placement", "optuna"]
JudgeOutcome = Literal["better", "worse", "no_difference", "futile", "inconclusive"]
TrialOutcome = Literal[
    "kept", "reverted", "no_difference", "futile", "inconclusive",    # the judge decided (better -> kept, worse ->
                                                                      # reverted)
    "unmeasured",        # inconclusive before a look's min_samples pairs: the load left before it measured anything
    "cut_short",         # the candidate's blocks broke the SLO while the incumbent's did not
    "failed",            # the engine refused the candidate
    "rolled_back", "pinned_over", "abandoned",    # an action replaced the trial
    "interrupted"]       # the controller that ran it died; its successor reverted it
Action = Literal[
    "start", "resume", "trial",                                       # the loop
    "keep", "revert", "cut_short", "fallback", "reenable",            # a trial's end (fallback, reenable: a kept probe)
    "no_data", "reapply", "apply_failed",
    "rollback", "pin", "release", "notify", "skip", "policy_switch"]                   # alerts and operators
