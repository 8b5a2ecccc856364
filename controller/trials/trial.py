"""A running switchback trial: the proposal under test, its judge, what each arm measured part by part, and the SLO
guard that cuts it short."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from controller.strategy import PROBES, Proposal
from controller.trials.judge import SwitchbackJudge
from controller.window_stats import merge_windows, slo_breaches
from policies import Policy
from seam import EngineConfig, Window


@dataclass
class Trial:
    id: int
    proposal: Proposal
    config: EngineConfig
    baseline: Window
    judge: SwitchbackJudge
    started: float = field(default_factory=time.monotonic)
    arms: dict[str, list[Window]] = field(default_factory=dict)    # what each arm measured, part by part
    no_data_windows: int = 0

    def add(self, part: Window) -> None:
        self.judge.add(part.blocks or ())
        for arm, window in (part.arms or {}).items():
            self.arms.setdefault(arm, []).append(window)

    def arm(self, name: str) -> Window | None:
        return merge_windows(self.arms[name]) if self.arms.get(name) else None


def candidate_breaches(part: Window, judge: SwitchbackJudge, policy: Policy) -> list[str]:
    """The SLO breaches of the candidate's blocks in this part, if they carry enough traffic to judge, the
    incumbent's blocks breach nothing (a breach on both sides is the traffic's, not the candidate's), and over the
    trial so far the candidate's blocks deliver tokens with longer gaps than their paired incumbent blocks (one-sided,
    at the judge's confidence): a stall that happened to land in the candidate's blocks is not the candidate's."""
    candidate = (part.arms or {}).get("candidate")
    if candidate is None:
        return []
    enough = candidate.emitted_tokens * 2 * policy.window.checks >= policy.window.min_emitted_tokens
    if not enough or incumbent_breaks_slo(part, policy):
        return []
    breaches = slo_breaches(candidate, policy)
    if not breaches:
        return []
    p_value, pairs = judge.slower_tokens()
    if p_value >= 1 - policy.judge.confidence:
        return []
    return [*breaches, f"its blocks' inter-token gaps are longer than the incumbent's over {pairs} block pairs "
                       f"(one-sided signed-rank p = {p_value:.3g})"]


def incumbent_breaks_slo(window: Window, policy: Policy) -> bool:
    """Do a trial window's incumbent blocks break the SLO? Then a breach is the traffic's, not the candidate's."""
    incumbent = (window.arms or {}).get("incumbent")
    return incumbent is not None and bool(slo_breaches(incumbent, policy))


def speculation_gain(kind: str, gain: float | None) -> float | None:
    """Measured speculative over plain decode throughput, from a probe of one mode against the other."""
    if gain is None or kind not in PROBES:
        return None
    return 1 / gain if kind == "fallback_probe" else gain
