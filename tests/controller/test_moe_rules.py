"""The capacity-factor and placement rules, on the engine's own Window and EngineConfig."""
from controller.rule_policy import RulePolicy
from engine.placement import Topology, check_placement
from policies import parse_policy
from seam import EngineConfig, LatencySummary, Window

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


def _skewed() -> Window:
    slots = HOT
    ranks = [[sum(HOT[0][:4]), sum(HOT[0][4:])]]
    balance = (sum(ranks[0]) / 2) / max(ranks[0])
    return _window(expert_tokens=HOT, slot_tokens=slots, rank_tokens=ranks, balance=balance)


def test_skewed_heat_re_places_experts_with_the_planner_and_predicts_the_gain():
    proposal = RulePolicy(PLACEMENT).propose(EngineConfig(spec_method="off"), _skewed(), 1)
    assert proposal.kind == "placement"
    check_placement(proposal.config.placement, Topology(1, 2, 4), num_layers=1, num_experts=8)
    assert proposal.inputs["predicted_balancedness"] > 0.95 > proposal.inputs["balancedness"]
    assert proposal.predicted_gain == proposal.inputs["predicted_balancedness"] / proposal.inputs["balancedness"]


def test_re_placement_waits_for_its_cooldown_and_skips_balanced_or_unprofitable_cases():
    policy = RulePolicy(PLACEMENT)
    assert policy.propose(EngineConfig(spec_method="off"), _skewed(), 1).kind == "placement"
    assert policy.propose(EngineConfig(spec_method="off"), _skewed(), 3) is None, "inside the cooldown"
    balanced = _window(expert_tokens=[[100] * 8], slot_tokens=[[100] * 8], rank_tokens=[[400, 400]], balance=1.0)
    assert RulePolicy(PLACEMENT).propose(EngineConfig(spec_method="off"), balanced, 1) is None
    costly = parse_policy({"placement": {"migration_stall_seconds": 1000.0}, "speculation": {"reprobe_windows": 1000}})
    assert RulePolicy(costly).propose(EngineConfig(spec_method="off"), _skewed(), 1) is None
