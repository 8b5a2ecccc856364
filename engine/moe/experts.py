"""One rank's share of a model's MoE layers: placement, slot weights, capacity factor, and what was routed."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.moe_layer import LOCAL, Exchange, ExpertSlots, MoEBlock, moe_forward
from engine.model.transformer import Transformer
from seam.placement import Topology, identity_placement


def expert_topology(num_experts: int, ranks: int, redundant_experts: int = 0) -> Topology:
    """One node, one device per rank, enough slots per device for every expert plus the redundant ones."""
    return Topology(nodes=1, devices=ranks, slots_per_device=-(-(num_experts + redundant_experts) // ranks))


def drop_logical_experts(target: Transformer) -> None:
    """Free the model's own expert weights once an ExpertRuntime holds this rank's slots; the MoE layers then
    run only through that runtime."""
    for block in target.moe_blocks:
        block.w1 = block.w3 = block.w2 = None


@dataclass
class StepCounts:
    """What the MoE layers routed during one step (every target forward since the last take)."""
    expert_tokens: torch.Tensor      # [layers, experts] pairs routed per logical expert, before drops
    slot_tokens: torch.Tensor        # [layers, slots] pairs computed per physical slot
    dropped_per_layer: torch.Tensor  # [layers] pairs dropped over capacity
    all_to_all_seconds: float        # time spent exchanging pair rows and gathering shards


class ExpertRuntime:
    """Runs target's MoE layers under a placement over topology, this rank holding only its own slots."""

    def __init__(self, target: Transformer, topology: Topology, exchange: Exchange = LOCAL):
        blocks = target.moe_blocks
        self.topology, self.exchange = topology, exchange
        self.num_experts = blocks[0].num_experts
        self.capacity_factor = 0.0
        self.placement = identity_placement(len(blocks), self.num_experts, topology)
        self._layer = {block: i for i, block in enumerate(blocks)}
        self._slots = [ExpertSlots.from_logical(phy2log, topology.slots_per_device, exchange.rank,
                                                block.w1, block.w3, block.w2)
                       for phy2log, block in zip(self.placement, blocks)]
        self._counts = self._zero_counts(blocks[0].w1.device)
        self._scratch: tuple[torch.Tensor, ...] | None = None   # one layer's slot weights, reused by replace()

    def __call__(self, block: MoEBlock, x: torch.Tensor) -> torch.Tensor:
        layer = self._layer[block]
        out, counts = moe_forward(x, block.gate, block.top_k, self._slots[layer], self.capacity_factor, self.exchange)
        self._counts.expert_tokens[layer] += counts.expert_tokens
        self._counts.slot_tokens[layer] += counts.slot_tokens
        self._counts.dropped_per_layer[layer] += counts.dropped
        return out

    def take_counts(self) -> StepCounts:
        counts = self._counts
        self._counts = self._zero_counts(counts.expert_tokens.device)
        return StepCounts(counts.expert_tokens.cpu(), counts.slot_tokens.cpu(), counts.dropped_per_layer.cpu(),
                          self.exchange.take_seconds())

    def replace(self, placement: list[list[int]]) -> None:
        """Move expert weights so that each rank holds its slots under placement; every rank calls this.

        The weights are rewritten in place, a layer at a time, through one layer-sized scratch kept between calls:
        a switchback trial switches placement every few steps, and a fresh set of weights per switch left RSS
        creeping up between the steps' activations."""
        spd, rank = self.topology.slots_per_device, self.exchange.rank
        for layer, (old, new) in enumerate(zip(self.placement, placement)):
            current = self._slots[layer]
            weights = (current.w1, current.w3, current.w2)
            if self._scratch is None:
                self._scratch = tuple(torch.empty_like(w) for w in weights)
            sends, receives = [], []
            for slot, expert in enumerate(new):
                dest = slot // spd
                holders = [s for s, e in enumerate(old) if e == expert]
                source = next((s for s in holders if s // spd == dest), holders[0])
                tags = [((layer * len(new) + slot) * 3) + part for part in range(3)]
                if rank == source // spd == dest:
                    for into, weight in zip(self._scratch, weights):
                        into[slot - rank * spd].copy_(weight[source - rank * spd])
                elif rank == source // spd:
                    sends += [(weight[source - rank * spd], dest, tag) for weight, tag in zip(weights, tags)]
                elif rank == dest:
                    receives += [(into[slot - rank * spd], source // spd, tag)
                                 for into, tag in zip(self._scratch, tags)]
            self.exchange.move(sends, receives)
            for weight, moved in zip(weights, self._scratch):
                weight.copy_(moved)
        self._slots = [ExpertSlots(phy2log, spd, rank, self.num_experts, slots.w1, slots.w3, slots.w2)
                       for phy2log, slots in zip(placement, self._slots)]
        self.placement = [list(phy2log) for phy2log in placement]

    def describe(self) -> dict:
        """This rank's own slots (logical expert per slot, per layer) and how many expert weights it keeps."""
        spd, rank = self.topology.slots_per_device, self.exchange.rank
        return {"rank": rank, "slots": [phy2log[rank * spd:(rank + 1) * spd] for phy2log in self.placement],
                "expert_parameters": sum(w.numel() for s in self._slots for w in (s.w1, s.w3, s.w2))}

    def _zero_counts(self, device: torch.device) -> StepCounts:
        layers = len(self._slots)
        return StepCounts(torch.zeros(layers, self.num_experts, dtype=torch.long, device=device),
                          torch.zeros(layers, self.topology.num_slots, dtype=torch.long, device=device),
                          torch.zeros(layers, dtype=torch.long, device=device), 0.0)

