"""Expert placement: which logical expert each physical slot holds, per layer, on a topology of devices.

A placement is `phy2log[layer][slot]`; slot s lives on device s // slots_per_device, and device d on node
d // devices_per_node. A logical expert may hold several slots (replicas); every logical expert holds one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class PlacementError(ValueError):
    """A placement that cannot be served; the message names what is wrong and where."""


@dataclass(frozen=True)
class Topology:
    nodes: int
    devices: int
    slots_per_device: int

    def __post_init__(self):
        for name in ("nodes", "devices", "slots_per_device"):
            if getattr(self, name) < 1:
                raise PlacementError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.devices % self.nodes:
            raise PlacementError(f"devices ({self.devices}) must be a multiple of nodes ({self.nodes})")

    @property
    def num_slots(self) -> int:
        return self.devices * self.slots_per_device

    @property
    def devices_per_node(self) -> int:
        return self.devices // self.nodes

    def device_of(self, slot: int) -> int:
        return slot // self.slots_per_device


def check_placement(phy2log: Sequence[Sequence[int]], topology: Topology, num_layers: int, num_experts: int) -> None:
    """Raise PlacementError unless every layer maps all slots to known experts and every expert has a slot."""
    if len(phy2log) != num_layers:
        raise PlacementError(f"placement has {len(phy2log)} layers; the model has {num_layers} MoE layers")
    for layer, slots in enumerate(phy2log):
        if len(slots) != topology.num_slots:
            raise PlacementError(f"layer {layer}: {len(slots)} slots; the topology has {topology.num_slots} "
                                 f"({topology.devices} devices x {topology.slots_per_device} slots)")
        unknown = sorted({e for e in slots if not 0 <= e < num_experts})
        if unknown:
            raise PlacementError(f"layer {layer}: unknown experts {unknown}; experts are 0..{num_experts - 1}")
        missing = sorted(set(range(num_experts)) - set(slots))
        if missing:
            raise PlacementError(f"layer {layer}: logical experts {missing} have no replica")


def identity_placement(num_layers: int, num_experts: int, topology: Topology) -> list[list[int]]:
    """Experts in order over the slots, the spare slots replicating experts 0, 1, ... again."""
    return [[slot % num_experts for slot in range(topology.num_slots)] for _ in range(num_layers)]


def tokens_per_device(slot_tokens: np.ndarray, topology: Topology) -> np.ndarray:
    """[layers, slots] tokens per physical slot -> [layers, devices]."""
    return slot_tokens.reshape(slot_tokens.shape[0], topology.devices, topology.slots_per_device).sum(axis=-1)


def balancedness(device_tokens: np.ndarray) -> float | None:
    """vLLM's figure: sum over layers of mean tokens per device / sum over layers of max; None without tokens."""
    peak = device_tokens.max(axis=-1).sum()
    return float(device_tokens.mean(axis=-1).sum() / peak) if peak > 0 else None


def slot_tokens(heat: np.ndarray, phy2log: Sequence[Sequence[int]]) -> np.ndarray:
    """[layers, slots] tokens per physical slot when each expert's tokens split evenly over its replicas."""
    heat, phy2log = np.asarray(heat, dtype=np.float64), np.asarray(phy2log, dtype=np.int64)
    replicas = np.zeros(heat.shape, dtype=np.int64)
    np.add.at(replicas, (np.arange(heat.shape[0])[:, None], phy2log), 1)
    return np.take_along_axis(heat, phy2log, axis=1) / np.take_along_axis(replicas, phy2log, axis=1)


def placement_balancedness(heat: np.ndarray, phy2log: Sequence[Sequence[int]], topology: Topology) -> float | None:
    """balancedness of the device loads that heat would put on this placement."""
    return balancedness(tokens_per_device(slot_tokens(heat, phy2log), topology))
