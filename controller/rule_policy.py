"""The rule policy: what to try next, from the measured Window and the goodput model. Each proposal becomes a
trial that the loop holds for a window and judges against the baseline window."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from controller.goodput import GoodputModel, batch_band
from controller.strategy import Proposal
from controller.window_stats import tokens_per_busy_second
from engine.placement import Topology, balancedness, tokens_per_device
from engine.planner import plan_placement
from policies import Policy
from seam import EngineConfig, Window


@dataclass
class RuleState:
    """What the rules remember between windows."""
    model: GoodputModel = field(default_factory=GoodputModel)
    last_mode_probe: int = 0                             # window index of the last speculation on/off probe
    rejected: dict[tuple, int] = field(default_factory=dict)   # (kind, value) -> window index it was reverted
    last_placement: int | None = None
    spec_method: str = "draft_model"                     # the method to re-enable speculation with


class RulePolicy:
    """A Strategy: rules over the goodput model, mode probes, capacity factor from drops, placement from heat."""
    name = "rules"

    def __init__(self, policy: Policy, state: RuleState | None = None):
        self.policy, self.state = policy, state or RuleState()

    def observe(self, window: Window) -> None:
        self.state.model.observe(window)

    def finished(self, proposal: Proposal, outcome: str, window: Window | None, window_index: int) -> None:
        if outcome != "kept":
            self.state.rejected[(proposal.kind, _value(proposal))] = window_index

    def released(self, config: EngineConfig) -> None:
        """An operator's pin ended: probe the other speculation mode at the next window rather than after
        reprobe_windows (a pin that turned speculation off should not keep it off once lifted)."""
        self.state.last_mode_probe = -self.policy.speculation.reprobe_windows
        self.state.rejected.pop(("speculation_probe", "speculation_probe"), None)

    def propose(self, current: EngineConfig, baseline: Window, window_index: int) -> Proposal | None:
        if current.spec_method != "off":
            self.state.spec_method = current.spec_method
        for rule in (self._mode_probe, self._draft_len, self._capacity_factor, self._placement):
            proposal = rule(current, baseline, window_index)
            if proposal is not None and not self._recently_rejected(proposal, window_index):
                return proposal
        return None

    def _recently_rejected(self, proposal: Proposal, window_index: int) -> bool:
        at = self.state.rejected.get((proposal.kind, _value(proposal)))
        return at is not None and window_index - at < self.policy.trial.retry_windows

    # -- speculation on/off, by probing the other mode ------------------------------------------------------------

    def _mode_probe(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        spec = self.policy.speculation
        if index - self.state.last_mode_probe < spec.reprobe_windows:
            return None
        self.state.last_mode_probe = index
        if current.speculative_len > 0:
            return Proposal(current.changed(spec_method="off"), "fallback_probe",
                            f"probe plain decoding: speculation stays only while it beats it by {spec.min_gain}x",
                            keep_gain=1 / spec.min_gain, inputs=self._inputs(baseline))
        model, k, band = self.state.model, current.draft_len or 1, batch_band(baseline.batch_size_mean)
        if model.ready(band):
            k = model.best(self._reachable(band), band).k
        threshold = spec.min_gain + spec.hysteresis
        return Proposal(current.changed(spec_method=self.state.spec_method, draft_len=k),
                        "speculation_probe", f"probe speculation at k={k}: re-enabled only if it beats plain "
                        f"decoding by {threshold:.3f}x (min_gain + hysteresis)", keep_gain=threshold,
                        inputs=self._inputs(baseline))

    # -- draft length from the goodput model ----------------------------------------------------------------------

    def _reachable(self, band: int) -> range:
        """k values a trial may try: measured costs extrapolate only k_step past the largest k measured."""
        spec = self.policy.speculation
        measured = max(self.state.model.measured_ks(band), default=0)
        return range(1, min(spec.k_max, measured + spec.k_step) + 1)

    def _draft_len(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        model, band = self.state.model, batch_band(baseline.batch_size_mean)
        if current.speculative_len == 0 or not model.ready(band):
            return None
        best = model.best(self._reachable(band), band)
        gain = model.gain(best.k, current.draft_len, band)
        if best.k == current.draft_len or gain < self.policy.trial.min_predicted_gain:
            return None
        return Proposal(current.changed(draft_len=best.k), "draft_len",
                        f"k {current.draft_len} -> {best.k}: expected goodput model predicts {gain:.3f}x",
                        keep_gain=self.policy.trial.keep_gain, predicted_gain=gain,
                        inputs={**self._inputs(baseline), "predictions": {
                            k: {"tokens_per_step": round(p.tokens_per_step, 4),
                                "seconds_per_step": round(p.seconds_per_step, 6)}
                            for k in self._reachable(band) for p in [model.predict(k, band)]}})

    # -- capacity factor and placement (MoE targets only) -----------------------------------------------------------

    def _capacity_factor(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        factor, dropped = current.capacity_factor, baseline.dropped_tokens
        if factor == 0 or not baseline.expert_tokens:
            return None
        capacity = self.policy.capacity
        routed = float(np.sum(baseline.expert_tokens))
        drop_rate = dropped / routed if routed else 0.0
        waste = 1 - (1 - drop_rate) / factor
        inputs = {**self._inputs(baseline), "drop_rate": drop_rate, "padding_waste": waste}
        if drop_rate > capacity.max_drop_rate and factor < capacity.max_factor:
            new = min(factor + capacity.step, capacity.max_factor)
            reason = f"capacity factor {factor} -> {new}: drop rate {drop_rate:.4f} > {capacity.max_drop_rate}"
        elif drop_rate == 0 and waste > capacity.max_padding_waste and factor > capacity.min_factor:
            new = max(factor - capacity.step, capacity.min_factor)
            reason = f"capacity factor {factor} -> {new}: padding waste {waste:.3f} > {capacity.max_padding_waste}"
        else:
            return None
        return Proposal(current.changed(capacity_factor=new), "capacity_factor", reason,
                        keep_gain=self.policy.trial.keep_gain, inputs=inputs)

    def _placement(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        balance, slot_tokens, rank_tokens = baseline.balancedness, baseline.slot_tokens, baseline.rank_tokens
        placement = self.policy.placement
        if balance is None or not slot_tokens or not rank_tokens or balance >= placement.rebalance_below:
            return None
        if self.state.last_placement is not None and index - self.state.last_placement < placement.cooldown_windows:
            return None
        devices = len(rank_tokens[0])
        topology = Topology(nodes=1, devices=devices, slots_per_device=len(slot_tokens[0]) // devices)
        heat = np.asarray(baseline.expert_tokens, dtype=float)
        phy2log = plan_placement(heat, topology)
        predicted = balancedness(tokens_per_device(_slot_heat(heat, phy2log), topology))
        if predicted is None or predicted <= balance:
            return None
        saved = baseline.target_forward_seconds * (1 - balance / predicted) * placement.payback_windows
        if saved <= placement.migration_stall_seconds:
            return None
        self.state.last_placement = index
        return Proposal(current.changed(placement=phy2log), "placement",
                        f"re-place experts: balancedness {balance:.3f} -> predicted {predicted:.3f}; saves "
                        f"{saved:.2f} s over {placement.payback_windows} windows > {placement.migration_stall_seconds}"
                        f" s stall", keep_gain=self.policy.trial.keep_gain, predicted_gain=predicted / balance,
                        inputs={**self._inputs(baseline), "balancedness": balance, "predicted_balancedness": predicted})

    def _inputs(self, baseline: Window) -> dict:
        return {"baseline_tokens_per_busy_second": round(tokens_per_busy_second(baseline), 2),
                "model": self.state.model.describe(batch_band(baseline.batch_size_mean))}


def _slot_heat(heat: np.ndarray, phy2log: list[list[int]]) -> np.ndarray:
    """Tokens per physical slot if each logical expert's tokens split evenly over its replicas."""
    out = np.zeros((len(phy2log), len(phy2log[0])))
    for layer, slots in enumerate(phy2log):
        replicas = np.bincount(slots, minlength=heat.shape[1])
        out[layer] = [heat[layer, e] / replicas[e] for e in slots]
    return out


def _value(proposal: Proposal) -> object:
    return {"draft_len": proposal.config.draft_len, "capacity_factor": proposal.config.capacity_factor
            }.get(proposal.kind, proposal.kind)
