"""The capacity-factor and placement rules, on the engine's own Window and EngineConfig."""
import numpy as np
import pytest

from controller.decide.calibration import Calibration
from controller.decide.expert_rules import heat_moved
from controller.decide.rule_policy import RulePolicy
from controller.trials.judge import INCONCLUSIVE
from policies import parse_policy
from seam import EngineConfig, LatencySummary, Window
from seam.placement import Topology, check_placement

EMPTY = LatencySummary.of([])


def _window(dropped: int = 0, routed: int = 10_000, rank_tokens=None, slot_tokens=None, balance=None,
            expert_tokens=None) -> Window:
    return Window(
        start=0.0, end=1.0, config_version=1, spec_method="off", draft_len=0, steps=100, num_drafts=0,
        drafted_tokens=0, accepted_tokens=0, drafted_per_position=[], accepted_per_position=[], emitted_tokens=500,
        prefill_tokens=0, finished_requests=5, target_forward_seconds=5.0, draft_forward_seconds=0.0,
        step_seconds=6.0, ttft_seconds=EMPTY, inter_token_seconds=EMPTY, e2e_seconds=EMPTY, batch_size_mean=4.0,
        batch_size_max=4, queue_depth_mean=0.0, queue_depth_max=0,
        expert_tokens=expert_tokens or [[routed // 8] * 8], dropped_tokens=dropped, dropped_per_layer=[dropped],
        slot_tokens=slot_tokens, rank_tokens=rank_tokens, balancedness=balance)


CAPACITY = parse_policy({"capacity": {"min_factor": 1.0, "max_factor": 2.0, "step": 0.25, "max_drop_rate": 0.01,
                                      "max_padding_waste": 0.3}, "speculation": {"reprobe_windows": 1000}})


def test_drops_above_the_bound_raise_the_capacity_factor():
    proposal = RulePolicy(CAPACITY).propose(EngineConfig(spec_method="off", capacity_factor=1.25), _window(500), 1)
    assert proposal.kind == "capacity_factor" and proposal.config.capacity_factor == 1.5
    assert proposal.inputs["drop_rate"] == 0.05


def test_padding_waste_without_drops_lowers_it_and_within_bounds_nothing_changes():
    lower = RulePolicy(CAPACITY).propose(EngineConfig(spec_method="off", capacity_factor=2.0), _window(0), 1)
    assert lower.config.capacity_factor == 1.75 and lower.inputs["padding_waste"] == 0.5
    assert RulePolicy(CAPACITY).propose(EngineConfig(spec_method="off", capacity_factor=1.25), _window(0), 1) is None
    assert RulePolicy(CAPACITY).propose(EngineConfig(spec_method="off", capacity_factor=2.0), _window(500), 1) is None


def test_dropless_and_dense_engines_are_left_alone():
    assert RulePolicy(CAPACITY).propose(EngineConfig(spec_method="off", capacity_factor=0.0), _window(500), 1) is None
    dense = _window(0)
    dense = Window(**{**dense.__dict__, "expert_tokens": None, "dropped_per_layer": None})
    assert RulePolicy(CAPACITY).propose(EngineConfig(spec_method="off", capacity_factor=1.5), dense, 1) is None


PLACEMENT = parse_policy({"placement": {"rebalance_below": 0.8, "cooldown_windows": 5, "migration_stall_seconds": 0.1,
                                        "payback_windows": 10}, "speculation": {"reprobe_windows": 1000}})
# Two ranks, four slots each, identity placement: experts 0-3 on rank 0, 4-7 on rank 1; the heat sits on rank 0.
HOT = [[900, 800, 700, 600, 10, 20, 30, 40]]


def _skewed(heat=HOT) -> Window:
    ranks = [[sum(heat[0][:4]), sum(heat[0][4:])]]
    balance = (sum(ranks[0]) / 2) / max(ranks[0])
    return _window(expert_tokens=heat, slot_tokens=heat, rank_tokens=ranks, balance=balance)


def test_skewed_heat_re_places_experts_with_the_planner_and_predicts_the_gain():
    proposal = RulePolicy(PLACEMENT).propose(EngineConfig(spec_method="off"), _skewed(), 1)
    assert proposal.kind == "placement"
    check_placement(proposal.config.placement, Topology(1, 2, 4), num_layers=1, num_experts=8)
    assert proposal.inputs["predicted_balancedness"] > 0.95 > proposal.inputs["balancedness"]
    assert proposal.raw_gain == proposal.inputs["predicted_balancedness"] / proposal.inputs["balancedness"]
    assert proposal.predicted_gain == proposal.raw_gain, "no trial has calibrated the what-if yet"


def test_the_re_placement_what_if_is_calibrated_by_what_its_trials_measured():
    """Trials that predicted a re-placement's gain and measured none shrink the next prediction, until the saving no
    longer earns back the stall."""
    stall = parse_policy({"placement": {"migration_stall_seconds": 5.0}, "speculation": {"reprobe_windows": 1000}})
    calibration = Calibration()
    raw = RulePolicy(stall, calibration=calibration).propose(EngineConfig(spec_method="off"), _skewed(), 1).raw_gain
    calibration.record("placement", raw, raw, 1.0)
    once = RulePolicy(stall, calibration=calibration).propose(EngineConfig(spec_method="off"), _skewed(), 1)
    assert once.raw_gain == raw and 1.0 < once.predicted_gain < raw
    assert f"calibrated {once.predicted_gain:.3f}x" in once.reason
    for _ in range(20):
        calibration.record("placement", raw, once.predicted_gain, 1.0)
    assert RulePolicy(stall, calibration=calibration).propose(EngineConfig(spec_method="off"), _skewed(), 1) is None


# HOT, with every expert's tokens a little off: routing noise, not a move (5 % of tokens elsewhere)
NOISY = [[870, 830, 680, 620, 14, 16, 36, 34]]
# the heat moved to rank 1's experts
MOVED = [[10, 20, 30, 40, 900, 800, 700, 600]]


@pytest.mark.parametrize("outcome", [INCONCLUSIVE, "no_difference", "reverted"])
def test_a_re_placement_not_kept_is_not_proposed_again_until_the_heat_moves(outcome):
    policy = RulePolicy(PLACEMENT)
    first = policy.propose(EngineConfig(spec_method="off"), _skewed(), 1)
    policy.finished(first, outcome, _skewed(), 2, 1.0)
    later = 1 + 2 * max(PLACEMENT.placement.cooldown_windows, PLACEMENT.trial.retry_windows)
    assert heat_moved(np.asarray(HOT, float), np.asarray(NOISY, float)) < PLACEMENT.placement.heat_shift
    assert policy.propose(EngineConfig(spec_method="off"), _skewed(), later) is None
    assert policy.propose(EngineConfig(spec_method="off"), _skewed(NOISY), later + 1) is None
    moved = policy.propose(EngineConfig(spec_method="off"), _skewed(MOVED), later + 2)
    assert moved.kind == "placement" and moved.config.placement != first.config.placement


def test_a_kept_or_unmeasured_re_placement_holds_nothing_back_but_its_cooldown():
    for outcome in ("kept", "unmeasured"):
        policy = RulePolicy(PLACEMENT)
        policy.finished(policy.propose(EngineConfig(spec_method="off"), _skewed(), 1), outcome, None, 2)
        assert policy.propose(EngineConfig(spec_method="off"), _skewed(), 50).kind == "placement", outcome


def test_a_released_pin_lifts_the_hold():
    policy = RulePolicy(PLACEMENT)
    policy.finished(policy.propose(EngineConfig(spec_method="off"), _skewed(), 1), INCONCLUSIVE, None, 2, 1.0)
    policy.released(EngineConfig(spec_method="off"))
    policy.state.last_mode_probe = 50                   # the probe the release brings forward has run
    assert policy.propose(EngineConfig(spec_method="off"), _skewed(), 50).kind == "placement"


def test_heat_moved_is_the_share_of_tokens_routed_elsewhere():
    assert heat_moved(np.asarray([[1, 1, 0, 0]], float), np.asarray([[0, 0, 2, 2]], float)) == 1.0
    assert heat_moved(np.asarray([[2, 2, 0, 0]], float), np.asarray([[1, 1, 1, 1]], float)) == 0.5
    assert heat_moved(np.asarray([[1, 3], [0, 0]], float), np.asarray([[2, 6], [5, 5]], float)) == 0.0


def test_re_placement_waits_for_its_cooldown_and_skips_balanced_or_unprofitable_cases():
    policy = RulePolicy(PLACEMENT)
    assert policy.propose(EngineConfig(spec_method="off"), _skewed(), 1).kind == "placement"
    assert policy.propose(EngineConfig(spec_method="off"), _skewed(), 3) is None, "inside the cooldown"
    balanced = _window(expert_tokens=[[100] * 8], slot_tokens=[[100] * 8], rank_tokens=[[400, 400]], balance=1.0)
    assert RulePolicy(PLACEMENT).propose(EngineConfig(spec_method="off"), balanced, 1) is None
    costly = parse_policy({"placement": {"migration_stall_seconds": 1000.0}, "speculation": {"reprobe_windows": 1000}})
    assert RulePolicy(costly).propose(EngineConfig(spec_method="off"), _skewed(), 1) is None
