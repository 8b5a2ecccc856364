"""Expert placement planner: which logical expert each physical slot holds, from measured heat.

What it optimises, per layer (layers are independent; all are planned at once, vectorised):
1. The peak device load. Balancedness (sum of mean device loads / sum of peak device loads) depends on nothing
   else: the mean is fixed by the heat. A replicated expert's tokens split evenly over its replicas.
   - Replicate: each spare slot goes to the expert with the highest load per replica (this minimises the
     heaviest replica, a lower bound on the peak).
   - Pack: heaviest replica first into the lightest device with a free slot (LPT, equal slot counts). Up to
     here this is DeepSeek EPLB's global policy, so the plan is never less balanced than that.
   - Refine: rounds in which each of the few heaviest devices trades one replica with one of the lightest
     devices, the trade that most lowers the larger of the two loads, while that stays below the heavy
     device's load now. A layer stops when its heaviest device finds no such trade.
2. Then, without raising any layer's peak: fewer nodes per replicated expert, so its traffic stays inside one
   node where it can. A replica outside its expert's home node (the node holding most of its replicas) trades
   places with an unreplicated expert inside the home node when both devices stay at or under the peak.
Ties go to the lowest expert, device and slot index, so a plan is deterministic. As in EPLB, a device may hold
two replicas of one expert (two shares of its tokens): the balance objective allows it, and forbidding it cost
balance on the most skewed loads tried.
"""
from __future__ import annotations

import numpy as np

from seam.placement import PlacementError, Topology

MAX_ROUNDS = 64         # refinement rounds at most
HEAVY_PER_ROUND = 4     # heaviest devices that trade in one round
PARTNERS = 16           # lightest devices they may trade with


def plan_placement(heat: np.ndarray, topology: Topology) -> list[list[int]]:
    """heat [layers, experts] tokens per logical expert -> phy2log [layers][slots]."""
    heat = np.asarray(heat, dtype=np.float64)
    if heat.ndim != 2 or 0 in heat.shape:
        raise PlacementError(f"heat must be [layers, experts] with at least one of each, got shape {heat.shape}")
    if not np.isfinite(heat).all() or (heat < 0).any():
        raise PlacementError("heat must be finite and non-negative")
    if topology.num_slots < heat.shape[1]:
        raise PlacementError(f"{topology.num_slots} slots ({topology.devices} devices x {topology.slots_per_device})"
                             f" cannot hold {heat.shape[1]} experts")
    counts = replica_counts(heat, topology.num_slots)
    packing = _Packing.lpt(heat, counts, topology)
    packing.refine()
    packing.gather_into_nodes()
    return packing.experts.reshape(heat.shape[0], -1).tolist()


def replica_counts(heat: np.ndarray, num_slots: int) -> np.ndarray:
    """[layers, experts] replicas per expert: one each, then each spare slot to the highest load per replica."""
    layers, experts = heat.shape
    counts = np.ones((layers, experts), dtype=np.int64)
    rows = np.arange(layers)
    for _ in range(num_slots - experts):
        counts[rows, np.argmax(heat / counts, axis=1)] += 1
    return counts


class _Packing:
    """Replicas on devices, for all layers at once: expert and load of slot [layer, device, slot]."""

    def __init__(self, experts: np.ndarray, loads: np.ndarray, topology: Topology):
        self.experts, self.loads, self.topology = experts, loads, topology
        self.device_loads = loads.sum(axis=-1)

    @classmethod
    def lpt(cls, heat: np.ndarray, counts: np.ndarray, topology: Topology) -> _Packing:
        layers, num_experts = heat.shape
        devices, per_device = topology.devices, topology.slots_per_device
        replica_experts = np.stack([np.repeat(np.arange(num_experts), row) for row in counts])
        replica_loads = np.take_along_axis(heat / counts, replica_experts, axis=1)
        order = np.argsort(-replica_loads, axis=1, kind="stable")
        replica_experts = np.take_along_axis(replica_experts, order, axis=1)
        replica_loads = np.take_along_axis(replica_loads, order, axis=1)
        open_loads = np.zeros(layers * devices)                 # a device's load, inf once its slots are full
        filled = np.zeros(layers * devices, dtype=np.int64)
        device_slot = np.zeros((2, *replica_loads.shape), dtype=np.int64)
        first_device = np.arange(layers) * devices
        for i in range(replica_loads.shape[1]):
            device = first_device + np.argmin(open_loads.reshape(layers, devices), axis=1)
            device_slot[:, :, i] = device - first_device, filled[device]
            open_loads[device] += replica_loads[:, i]
            filled[device] += 1
            open_loads[device[filled[device] == per_device]] = np.inf
        rows = np.arange(layers)[:, None]
        experts = np.zeros((layers, devices, per_device), dtype=np.int64)
        loads = np.zeros((layers, devices, per_device))
        experts[rows, device_slot[0], device_slot[1]] = replica_experts
        loads[rows, device_slot[0], device_slot[1]] = replica_loads
        return cls(experts, loads, topology)

    def refine(self) -> None:
        """Rounds of swaps: each of a layer's heaviest devices trades one replica with one of its lightest devices,
        choosing the trade that most lowers the larger of the two loads, where that is below the heavy device's
        load now. A light device trades with one heavy device per round (the heaviest that wants it)."""
        devices = self.topology.devices
        heavy_count = max(1, min(HEAVY_PER_ROUND, devices // 2))
        light_count = min(PARTNERS, devices - heavy_count)
        active = np.arange(self.experts.shape[0])
        for _ in range(MAX_ROUNDS):
            if active.size == 0 or light_count == 0:
                return
            order = np.argsort(self.device_loads[active], axis=1, kind="stable")
            improved = self._trade(active, order[:, ::-1][:, :heavy_count], order[:, :light_count])
            active = active[improved]

    def _trade(self, layers: np.ndarray, heavy: np.ndarray, light: np.ndarray) -> np.ndarray:
        """heavy [n, T] (heaviest first) and light [n, K] devices of each layer; returns which layers' heaviest
        device traded (once it cannot, the layer's peak stays where it is)."""
        n, per_device = np.arange(layers.size)[:, None], self.topology.slots_per_device
        heavy_loads, light_loads = self.device_loads[layers[:, None], heavy], self.device_loads[layers[:, None], light]
        half_gap = ((heavy_loads[:, :, None] - light_loads[:, None, :]) / 2).astype(np.float32)   # [n, T, K]
        loads = self.loads.astype(np.float32, copy=False)
        # the larger load after trading a for b is the pair's mean plus |a - b - half the gap|
        miss = np.abs(loads[layers[:, None], heavy][:, :, None, :, None] - half_gap[..., None, None]
                      - loads[layers[:, None], light][:, None, :, None, :])                  # [n, T, K, S, S]
        larger = (miss + (heavy_loads.astype(np.float32)[:, :, None] - half_gap)[..., None, None])
        larger = larger.reshape(*heavy.shape, -1)
        best = larger.argmin(axis=-1)                                                        # [n, T]
        wants = np.take_along_axis(larger, best[..., None], axis=-1)[..., 0] < heavy_loads * (1 - 1e-6)
        partner, out_slot, in_slot = np.unravel_index(best, (light.shape[1], per_device, per_device))
        partner = light[n, partner]
        heavier = np.tri(heavy.shape[1], k=-1, dtype=bool)                                   # [t, t'] t' before t
        taken = ((partner[:, :, None] == partner[:, None, :]) & wants[:, None, :] & heavier).any(axis=-1)
        trades = wants & ~taken
        rows, columns = np.nonzero(trades)
        self._swap(layers[rows], heavy[rows, columns], out_slot[rows, columns], partner[rows, columns],
                   in_slot[rows, columns])
        return trades[:, 0]

    def _swap(self, layers, device_a, slot_a, device_b, slot_b) -> None:
        expert_a, expert_b = self.experts[layers, device_a, slot_a], self.experts[layers, device_b, slot_b]
        load_a, load_b = self.loads[layers, device_a, slot_a], self.loads[layers, device_b, slot_b]
        self.experts[layers, device_a, slot_a], self.experts[layers, device_b, slot_b] = expert_b, expert_a
        self.loads[layers, device_a, slot_a], self.loads[layers, device_b, slot_b] = load_b, load_a
        self.device_loads[layers, device_a] += load_b - load_a
        self.device_loads[layers, device_b] += load_a - load_b

    def gather_into_nodes(self) -> None:
        """Swap replicas into their expert's home node (the one holding most of them), keeping every peak."""
        topology = self.topology
        layers, devices, per_device = self.experts.shape
        slots_per_node = topology.devices_per_node * per_device
        slot_node = np.arange(devices * per_device) // slots_per_node
        flat = self.experts.reshape(layers, -1)
        num_experts = flat.max() + 1
        cell = (np.arange(layers)[:, None] * num_experts + flat) * topology.nodes + slot_node[None, :]
        per_node = np.bincount(cell.ravel(), minlength=layers * num_experts * topology.nodes)
        per_node = per_node.reshape(layers, num_experts, topology.nodes)
        replicas, home = per_node.sum(axis=-1), per_node.argmax(axis=-1)
        rows = np.arange(layers)[:, None]
        fits_one_node = (replicas > 1) & (replicas <= topology.devices_per_node)
        strays = fits_one_node[rows, flat] & (slot_node[None, :] != home[rows, flat])
        peak = self.device_loads.max(axis=1)
        single = replicas == 1
        # a trade moves load |a - b| onto one of its two devices, which fits under the peak only if |a - b| is at
        # most the peak minus the lightest device's load: strays with no such partner in their home node stay
        layer, slot = np.nonzero(strays)
        node_slots = home[layer, flat[layer, slot]][:, None] * slots_per_node + np.arange(slots_per_node)
        flat_loads = self.loads.reshape(layers, -1)
        gap = np.abs(flat_loads[layer[:, None], node_slots] - flat_loads[layer, slot][:, None])
        slack = (peak - self.device_loads.min(axis=1))[layer][:, None]
        strays[layer, slot] = (single[layer[:, None], flat[layer[:, None], node_slots]] & (gap <= slack)).any(axis=1)
        rank = np.where(strays, np.cumsum(strays, axis=1) - 1, -1)
        for round_ in range(int(strays.sum(axis=1).max(initial=0))):
            layer, slot = np.nonzero(rank == round_)
            self._gather(layer, slot // per_device, slot % per_device, home, single, peak)

    def _gather(self, layer, device, slot, home, single, peak) -> None:
        """Swap each (layer, device, slot) replica with an unreplicated expert in its home node, if peak-neutral."""
        per_device, devices_per_node = self.topology.slots_per_device, self.topology.devices_per_node
        n = np.arange(layer.size)[:, None]
        expert, load = self.experts[layer, device, slot], self.loads[layer, device, slot]
        node_devices = home[layer, expert][:, None] * devices_per_node + np.arange(devices_per_node)   # [n, Dn]
        partners = self.experts[layer[:, None], node_devices]                                        # [n, Dn, S]
        partner_loads = self.loads[layer[:, None], node_devices]
        node_loads = self.device_loads[layer[:, None], node_devices][..., None]
        larger = np.maximum(node_loads - partner_loads + load[:, None, None],
                            self.device_loads[layer, device][:, None, None] - load[:, None, None] + partner_loads)
        allowed = (single[layer[:, None, None], partners] & ~(partners == expert[:, None, None]).any(axis=-1)[..., None]
                   & (larger <= peak[layer][:, None, None]))
        best = np.where(allowed, larger, np.inf).reshape(layer.size, -1).argmin(axis=1)
        ok = allowed.reshape(layer.size, -1)[n[:, 0], best]
        self._swap(layer[ok], device[ok], slot[ok], node_devices[ok, best[ok] // per_device], best[ok] % per_device)
