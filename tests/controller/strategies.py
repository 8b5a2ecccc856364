"""A strategy for controller tests: one proposal, once, recording what the controller teaches and tells it."""
from __future__ import annotations

from collections.abc import Callable

from controller.strategy import Proposal
from seam import EngineConfig


class OneTrial:
    """Proposes candidate(current), kind draft_len, once; records the windows it observes and its trial's outcomes
    and measured gains."""
    name = "one-trial"

    def __init__(self, candidate: Callable[[EngineConfig], EngineConfig], reason: str):
        self.candidate, self.reason = candidate, reason
        self.proposed, self.observed, self.outcomes, self.measured = False, [], [], []

    def observe(self, window):
        self.observed.append(window)

    def released(self, config):
        pass

    def propose(self, current, baseline, window_index):
        if self.proposed:
            return None
        self.proposed = True
        return Proposal(self.candidate(current), "draft_len", self.reason, keep_gain=1.0)

    def finished(self, proposal, outcome, window, window_index, measured_gain=None):
        self.outcomes.append(outcome)
        self.measured.append(measured_gain)
