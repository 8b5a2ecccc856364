"""DeepSeek EPLB's greedy placement, written from its description, as the planner benchmark's peer.

Hierarchical policy when the expert groups divide evenly over the nodes: pack groups onto nodes, replicate
inside each node (a replica at a time to the expert with the highest load per replica), then pack each node's
replicas onto its devices. Otherwise the global policy: the same with one group and one node. Packing is
EPLB's balanced packing: heaviest item first, into the lightest pack that still has room, equal counts per
pack. One layer at a time, as in EPLB.
"""
from __future__ import annotations

import numpy as np

from seam.placement import Topology


def eplb_placement(heat: np.ndarray, topology: Topology, num_groups: int) -> list[list[int]]:
    heat = np.asarray(heat, dtype=np.float64)
    num_experts = heat.shape[1]
    if num_experts % num_groups == 0 and num_groups % topology.nodes == 0:
        return [_hierarchical(row, topology, num_groups, topology.nodes) for row in heat]
    return [_hierarchical(row, topology, 1, 1) for row in heat]


def _hierarchical(heat: np.ndarray, topology: Topology, num_groups: int, num_nodes: int) -> list[int]:
    group_size = len(heat) // num_groups
    group_node = _balanced_packing(heat.reshape(num_groups, group_size).sum(axis=1), num_nodes)
    devices_per_node = topology.devices // num_nodes
    phy2log: list[int] = []
    for node in range(num_nodes):
        experts = np.concatenate([np.arange(g * group_size, (g + 1) * group_size)
                                  for g in range(num_groups) if group_node[g][0] == node])
        counts = _replicate(heat[experts], devices_per_node * topology.slots_per_device)
        replicas = np.repeat(experts, counts)
        replica_loads = np.repeat(heat[experts] / counts, counts)
        placed = sorted(zip(_balanced_packing(replica_loads, devices_per_node), replicas.tolist()))
        phy2log += [expert for _, expert in placed]
    return phy2log


def _replicate(heat: np.ndarray, num_slots: int) -> np.ndarray:
    counts = np.ones(len(heat), dtype=np.int64)
    for _ in range(num_slots - len(heat)):
        counts[np.argmax(heat / counts)] += 1
    return counts


def _balanced_packing(weights: np.ndarray, num_packs: int) -> list[tuple[int, int]]:
    """(pack, rank within the pack) per item."""
    capacity = len(weights) // num_packs
    pack_weights, pack_items = [0.0] * num_packs, [0] * num_packs
    placed = [(0, 0)] * len(weights)
    for item in np.argsort(-weights, kind="stable"):
        pack = min((p for p in range(num_packs) if pack_items[p] < capacity), key=pack_weights.__getitem__)
        placed[item] = (pack, pack_items[pack])
        pack_weights[pack] += weights[item]
        pack_items[pack] += 1
    return placed
