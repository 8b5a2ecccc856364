"""What the loop asks of a policy: a Strategy observes windows, proposes one change at a time as a Proposal, and
hears how each trial ended. The rule policy (rule_policy.py) and the Optuna search (optuna_search.py) are the two."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from controller.outcomes import ProposalKind, TrialOutcome
from seam import EngineConfig, Window

UNMEASURED: TrialOutcome = "unmeasured"     # inconclusive before a look's min_samples pairs: the load left before
                                            # it measured anything
PROBES: tuple[ProposalKind, ...] = ("fallback_probe", "speculation_probe")
# PROBES: trials of the other speculation mode at one batch band, k to or from 0 there, not a change predicted to pay


@dataclass(frozen=True)
class Proposal:
    config: EngineConfig        # unversioned; the loop records it as a new version
    kind: ProposalKind
    reason: str
    keep_gain: float            # keep the trial if the judge's lower bound of candidate / incumbent clears this
    predicted_gain: float | None = None     # calibrated (controller.decide.calibration): what the proposal was made on
    raw_gain: float | None = None           # what the goodput model predicted before calibration
    inputs: dict = field(default_factory=dict)
    optuna_trial: object | None = None


class Strategy(Protocol):
    name: str

    def observe(self, window: Window) -> None:
        """Every window the loop judged worth reading, trial or not."""

    def propose(self, current: EngineConfig, baseline: Window, window_index: int) -> Proposal | None:
        """The next change to try from `current`, judged against `baseline`; None: nothing worth trying now."""

    def finished(self, proposal: Proposal, outcome: TrialOutcome, window: Window | None, window_index: int,
                 measured_gain: float | None = None) -> None:
        """How a proposal's trial ended (kept, reverted, no_difference, futile, inconclusive, unmeasured, cut_short,
        rolled_back, failed); window: what the candidate's blocks measured (None when it ended without one);
        measured_gain: the judge's estimate of candidate / incumbent (None when it made none)."""

    def released(self, config: EngineConfig) -> None:
        """An operator's pin on config ended."""
