"""The expert placement planner: balance, validity, replicas to the hottest experts, nodes, refusals."""
import numpy as np
import pytest

from controller.decide.planner import plan_placement
from governor.bench.eplb import eplb_placement
from seam.placement import (PlacementError, Topology, check_placement, identity_placement, placement_balancedness,
                            slot_tokens)


def zipf_heat(layers: int, experts: int, skew: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(1000 / np.arange(1, experts + 1) ** skew) for _ in range(layers)])


def split_nodes(phy2log: list[list[int]], topology: Topology) -> int:
    """(layer, expert) pairs whose replicas sit on more than one node."""
    slots_per_node = topology.devices_per_node * topology.slots_per_device
    return sum(len({s // slots_per_node for s, e in enumerate(row) if e == expert}) > 1
               for row in phy2log for expert in set(row))


@pytest.mark.parametrize("skew", [0.5, 1.0, 1.5])
@pytest.mark.parametrize("slots_per_device", [4, 5])
def test_balances_skewed_load_better_than_identity_and_at_least_as_well_as_eplb(skew, slots_per_device):
    topology = Topology(nodes=4, devices=16, slots_per_device=slots_per_device)
    heat = zipf_heat(layers=6, experts=64, skew=skew)
    ours = placement_balancedness(heat, plan_placement(heat, topology), topology)
    identity = placement_balancedness(heat, identity_placement(6, 64, topology), topology)
    eplb_global = placement_balancedness(heat, eplb_placement(heat, topology, num_groups=1), topology)
    eplb_nodes = placement_balancedness(heat, eplb_placement(heat, topology, num_groups=4), topology)
    assert ours > identity
    assert ours >= eplb_global and ours >= eplb_nodes


def test_refinement_beats_eplb_where_spare_slots_leave_room():
    topology = Topology(nodes=2, devices=16, slots_per_device=5)
    heat = zipf_heat(layers=4, experts=64, skew=0.5) * np.random.default_rng(0).uniform(0.8, 1.2, (4, 64))
    ours = placement_balancedness(heat, plan_placement(heat, topology), topology)
    assert ours > placement_balancedness(heat, eplb_placement(heat, topology, num_groups=1), topology) + 0.005


@pytest.mark.parametrize("nodes,devices,slots,experts", [(1, 1, 3, 3), (1, 3, 2, 5), (2, 6, 3, 13), (3, 9, 4, 30),
                                                          (4, 8, 1, 8)])
def test_every_plan_passes_check_placement(nodes, devices, slots, experts):
    topology = Topology(nodes, devices, slots)
    for seed in range(3):
        heat = np.random.default_rng(seed).exponential(100, (3, experts)) * (seed > 0)   # seed 0: all zeros
        phy2log = plan_placement(heat, topology)
        check_placement(phy2log, topology, 3, experts)
        assert all(isinstance(e, int) for row in phy2log for e in row)


def test_replicas_go_to_the_hottest_experts():
    heat = np.array([[1.0, 50, 2, 3, 40, 1, 2, 1], [9, 8, 7, 100, 6, 5, 4, 3]])
    phy2log = plan_placement(heat, Topology(nodes=1, devices=5, slots_per_device=2))   # two spare slots
    assert sorted(e for e in set(phy2log[0]) if phy2log[0].count(e) > 1) == [1, 4]
    assert phy2log[1].count(3) == 3 and len(set(phy2log[1])) == 8


def test_a_replicated_expert_splits_its_tokens_evenly():
    heat = np.array([[90.0, 10, 10, 10]])
    phy2log = plan_placement(heat, Topology(nodes=1, devices=3, slots_per_device=2))
    tokens = slot_tokens(heat, phy2log)[0]
    assert sorted(tokens[[s for s, e in enumerate(phy2log[0]) if e == 0]]) == [30, 30, 30]
    assert tokens.sum() == pytest.approx(heat.sum())


def test_keeps_a_replicated_experts_replicas_inside_one_node_when_balance_allows():
    topology = Topology(nodes=2, devices=4, slots_per_device=3)
    heat = np.array([[67.0, 80, 3, 80, 47, 52, 63, 29, 97, 6]])
    ours, eplb = plan_placement(heat, topology), eplb_placement(heat, topology, num_groups=1)
    assert split_nodes(eplb, topology) > 0 and split_nodes(ours, topology) == 0
    assert placement_balancedness(heat, ours, topology) >= placement_balancedness(heat, eplb, topology)


def test_plans_are_deterministic():
    topology = Topology(nodes=2, devices=8, slots_per_device=5)
    heat = zipf_heat(layers=3, experts=32, skew=1.0)
    assert plan_placement(heat, topology) == plan_placement(heat.copy(), topology)


def test_refuses_more_experts_than_slots():
    with pytest.raises(PlacementError, match="8 slots .* cannot hold 9 experts"):
        plan_placement(np.ones((2, 9)), Topology(nodes=1, devices=4, slots_per_device=2))


@pytest.mark.parametrize("heat,problem", [(np.array([[1.0, -1.0]]), "non-negative"),
                                          (np.array([[1.0, np.nan]]), "finite"),
                                          (np.ones(4), r"\[layers, experts\]"),
                                          (np.ones((2, 0)), "at least one of each"),
                                          (np.ones((0, 4)), "at least one of each")])
def test_refuses_bad_heat(heat, problem):
    with pytest.raises(PlacementError, match=problem):
        plan_placement(heat, Topology(nodes=1, devices=2, slots_per_device=2))


@pytest.mark.parametrize("nodes,devices,slots,problem", [(0, 4, 2, "nodes must be >= 1"),
                                                         (1, 0, 2, "devices must be >= 1"),
                                                         (1, 4, 0, "slots_per_device must be >= 1"),
                                                         (3, 4, 2, r"devices \(4\) must be a multiple of nodes \(3\)")])
def test_refuses_bad_topologies(nodes, devices, slots, problem):
    with pytest.raises(PlacementError, match=problem):
        Topology(nodes, devices, slots)


@pytest.mark.parametrize("phy2log,problem", [([[0, 1, 2, 3]], "1 layers; the model has 2"),
                                             ([[0, 1, 2], [0, 1, 2, 3]], "layer 0: 3 slots; the topology has 4"),
                                             ([[0, 1, 2, 3], [0, 1, 2, 4]], r"layer 1: unknown experts \[4\]"),
                                             ([[0, 1, 2, 3], [0, 1, 1, 2]], r"layer 1: logical experts \[3\] have no")])
def test_check_placement_refuses_unservable_placements(phy2log, problem):
    with pytest.raises(PlacementError, match=problem):
        check_placement(phy2log, Topology(nodes=1, devices=2, slots_per_device=2), num_layers=2, num_experts=4)


def test_balancedness_of_a_placement_without_tokens_is_none():
    topology = Topology(nodes=1, devices=2, slots_per_device=2)
    assert placement_balancedness(np.zeros((2, 3)), plan_placement(np.zeros((2, 3)), topology), topology) is None
