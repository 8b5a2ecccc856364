"""The rules for MoE targets: the capacity factor from drops and padding, and re-placing experts from their heat."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from controller.decide.calibration import Calibration
from controller.decide.planner import plan_placement
from controller.outcomes import TrialOutcome
from controller.strategy import UNMEASURED, Proposal
from policies.schema import CapacityPolicy, PlacementPolicy
from seam import EngineConfig, Window
from seam.placement import Topology, balancedness, tokens_per_device


@dataclass
class PlacementMemory:
    """What the placement rule remembers between windows."""
    last: int | None = None                 # window index of the last re-placement proposed
    planned_on: np.ndarray | None = None    # the expert heat it was planned from
    held: np.ndarray | None = None          # ... if its trial did not keep it: none until the heat moves away from it

    def finished(self, outcome: TrialOutcome) -> None:
        if outcome not in ("failed", UNMEASURED):
            self.held = None if outcome == "kept" else self.planned_on


def capacity_factor_change(current: EngineConfig, baseline: Window, capacity: CapacityPolicy, keep_gain: float,
                           inputs: Callable[[], dict]) -> Proposal | None:
    """Raise the capacity factor a step while too many tokens drop; lower it while none do and too much capacity
    sits unused."""
    factor, dropped = current.capacity_factor, baseline.dropped_tokens
    if factor == 0 or not baseline.expert_tokens:
        return None
    routed = float(np.sum(baseline.expert_tokens))
    drop_rate = dropped / routed if routed else 0.0
    waste = 1 - (1 - drop_rate) / factor
    if drop_rate > capacity.max_drop_rate and factor < capacity.max_factor:
        new = min(factor + capacity.step, capacity.max_factor)
        reason = f"capacity factor {factor} -> {new}: drop rate {drop_rate:.4f} > {capacity.max_drop_rate}"
    elif drop_rate == 0 and waste > capacity.max_padding_waste and factor > capacity.min_factor:
        new = max(factor - capacity.step, capacity.min_factor)
        reason = f"capacity factor {factor} -> {new}: padding waste {waste:.3f} > {capacity.max_padding_waste}"
    else:
        return None
    return Proposal(current.changed(capacity_factor=new), "capacity_factor", reason, keep_gain=keep_gain,
                    inputs={**inputs(), "drop_rate": drop_rate, "padding_waste": waste})


def re_placement(current: EngineConfig, baseline: Window, index: int, placement: PlacementPolicy,
                 memory: PlacementMemory, calibration: Calibration, keep_gain: float,
                 inputs: Callable[[], dict]) -> Proposal | None:
    """Re-place experts by the planner when balancedness is low and the calibrated gain, over payback_windows,
    earns back the migration stall. One whose trial was not kept holds off until the heat moves heat_shift away
    from what it was planned on: on the same heat the planner proposes the same placement, and in `make run` the
    same re-placement (balancedness 0.74 -> 0.98 predicted, 0.98-1.02x measured) came back every 2 minutes."""
    balance, slot_tokens, rank_tokens = baseline.balancedness, baseline.slot_tokens, baseline.rank_tokens
    if balance is None or not slot_tokens or not rank_tokens or balance >= placement.rebalance_below:
        return None
    if memory.last is not None and index - memory.last < placement.cooldown_windows:
        return None
    heat = np.asarray(baseline.expert_tokens, dtype=float)
    if memory.held is not None and heat_moved(memory.held, heat) < placement.heat_shift:
        return None
    devices = len(rank_tokens[0])
    topology = Topology(nodes=1, devices=devices, slots_per_device=len(slot_tokens[0]) // devices)
    phy2log = plan_placement(heat, topology)
    predicted = balancedness(tokens_per_device(_slot_heat(heat, phy2log), topology))
    if predicted is None or predicted <= balance:
        return None
    raw = predicted / balance
    gain = calibration.corrected("placement", raw)
    saved = baseline.target_forward_seconds * (1 - 1 / gain) * placement.payback_windows
    if saved <= placement.migration_stall_seconds:
        return None
    memory.last, memory.planned_on = index, heat
    return Proposal(current.changed(placement=phy2log), "placement",
                    f"re-place experts: balancedness {balance:.3f} -> predicted {predicted:.3f} ({raw:.3f}x, "
                    f"calibrated {gain:.3f}x); saves {saved:.2f} s over {placement.payback_windows} windows > "
                    f"{placement.migration_stall_seconds} s stall", keep_gain=keep_gain, predicted_gain=gain,
                    raw_gain=raw, inputs={**inputs(), "balancedness": balance, "predicted_balancedness": predicted})


def heat_moved(before: np.ndarray, after: np.ndarray) -> float:
    """The share of routed tokens that went to other experts between two heats (layers x experts): the total
    variation distance of each layer's token shares, averaged over the layers that routed tokens in both."""
    if before.shape != after.shape:
        return 1.0
    totals_before, totals_after = before.sum(axis=1), after.sum(axis=1)
    routed = (totals_before > 0) & (totals_after > 0)
    if not routed.any():
        return 0.0
    shares_before = before[routed] / totals_before[routed, None]
    shares_after = after[routed] / totals_after[routed, None]
    return float(np.mean(np.abs(shares_before - shares_after).sum(axis=1) / 2))


def _slot_heat(heat: np.ndarray, phy2log: list[list[int]]) -> np.ndarray:
    """Tokens per physical slot if each logical expert's tokens split evenly over its replicas."""
    out = np.zeros((len(phy2log), len(phy2log[0])))
    for layer, slots in enumerate(phy2log):
        replicas = np.bincount(slots, minlength=heat.shape[1])
        out[layer] = [heat[layer, e] / replicas[e] for e in slots]
    return out
