"""Fleet canaries (policy `trial.mode: canary`): a trial's Experiment runs as a canary across replicas instead of a
switchback on each. The first `trial.canary_replicas` answering replicas take the candidate, the others keep the
incumbent; at every check the canary replicas' tokens per busy second and the others' (the concurrent baseline, as
Kayenta and Argo use) form one pair for the same switchback judge (controller/trials/judge.py). The controller loop is
unchanged: it sees the pairs as blocks and each side as an arm, keeps (the candidate then goes to every replica) or
reverts (the canary gets the incumbent back), and a replica serving either arm's version is where it should be.
With fewer than two replicas answering, or in switchback mode, every change passes through as it is."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from controller.clients import HttpClient
from controller.window_stats import MIXED_VERSIONS, merge_windows
from policies import TrialPolicy
from seam import Block, EngineConfig, Experiment, Window

CANARY = "canary"       # the source of the blocks a canary's checks make


class FleetCanary:
    """An EngineClient over a fleet of replicas that runs Experiments as canaries when the policy says so."""

    def __init__(self, fleet: HttpClient, trial_policy: Callable[[], TrialPolicy]):
        self.fleet, self.trial_policy = fleet, trial_policy
        self.canaries: list[str] = []       # the replicas on the candidate while a canary runs
        self._pairs = 0

    @property
    def degraded(self) -> dict[str, str]:
        return self.fleet.degraded

    def check(self, config: EngineConfig) -> None:
        self.fleet.check(config)

    def config(self) -> EngineConfig:
        return self.fleet.config()

    def versions(self) -> dict[str, int]:
        return self.fleet.versions()

    def apply(self, change: EngineConfig | Experiment) -> None:
        answering = [url for url in self.fleet.urls if url not in self.fleet.degraded]
        policy = self.trial_policy()
        if not isinstance(change, Experiment) or policy.mode != "canary" or len(answering) < 2:
            self.fleet.apply(change)
            self.canaries = []
            return
        self.check(change.incumbent)
        self.check(change.candidate)
        canaries = answering[:min(policy.canary_replicas, len(answering) - 1)]
        self.fleet.apply_each({url: change.candidate if url in canaries else change.incumbent for url in answering},
                              change.incumbent)
        self.canaries, self._pairs = canaries, 0

    def snapshot(self) -> Window:
        windows = self.fleet.windows()
        merged = merge_windows(list(windows.values()))
        canary = [window for url, window in windows.items() if url in self.canaries]
        baseline = [window for url, window in windows.items() if url not in self.canaries]
        if not self.canaries:
            return merged
        if not canary or not baseline:      # one side did not answer: no data, and a trial without any ends
            return dataclasses.replace(merged, config_version=MIXED_VERSIONS, arms=None, blocks=None)
        arms = {"candidate": merge_windows(canary), "incumbent": merge_windows(baseline)}
        blocks = [_block(2 * self._pairs, "incumbent", arms["incumbent"]),
                  _block(2 * self._pairs + 1, "candidate", arms["candidate"])]
        self._pairs += 1
        return dataclasses.replace(merged, arms=arms, blocks=blocks)


def _block(index: int, arm: str, window: Window) -> Block:
    """One arm's side of a check as a judge's block; its sample is tokens per busy second (replicas' windows do
    not tell decode-only steps apart: both sides take the same kind of traffic over the same seconds)."""
    return Block(index=index, arm=arm, config_version=window.config_version, steps=window.steps,
                 emitted_tokens=window.emitted_tokens, busy_seconds=window.step_seconds,
                 inter_token_seconds=window.inter_token_seconds.mean, decode_tokens=window.emitted_tokens,
                 decode_seconds=window.step_seconds, sequences=round(window.batch_size_mean * window.steps),
                 source=CANARY)
