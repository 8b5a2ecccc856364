"""One rank's share of a model's MoE layers: placement, slot weights, capacity factor, and what was routed."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.moe import LOCAL, Exchange, ExpertSlots, MoEBlock, moe_forward
from engine.placement import Topology, identity_placement
from engine.transformer import Transformer


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
        """Move expert weights so that each rank holds its slots under placement; every rank calls this."""
        spd, rank = self.topology.slots_per_device, self.exchange.rank
        sends, receives, builders, fresh_layers = [], [], [], []
        for layer, (old, new) in enumerate(zip(self.placement, placement)):
            current = self._slots[layer]
            fresh = [torch.empty_like(current.w1), torch.empty_like(current.w3), torch.empty_like(current.w2)]
            fresh_layers.append(fresh)
            for slot, expert in enumerate(new):
                dest = slot // spd
                holders = [s for s, e in enumerate(old) if e == expert]
                source = next((s for s in holders if s // spd == dest), holders[0])
                tag = layer * len(new) + slot
                if rank == source // spd == dest:
                    for into, weights in zip(fresh, (current.w1, current.w3, current.w2)):
                        into[slot - rank * spd] = weights[source - rank * spd]
                elif rank == source // spd:
                    sends.append((_pack(current, source - rank * spd), dest, tag))
                elif rank == dest:
                    buffer = torch.empty(sum(w[0].numel() for w in fresh), dtype=current.w1.dtype,
                                         device=current.w1.device)
                    receives.append((buffer, source // spd, tag))
                    builders.append((fresh, slot - rank * spd, buffer))
        self.exchange.move(sends, receives)
        for fresh, local_slot, buffer in builders:
            _unpack(buffer, fresh, local_slot)
        self._slots = [ExpertSlots(phy2log, spd, rank, self.num_experts, *fresh)
                       for phy2log, fresh in zip(placement, fresh_layers)]
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


def _pack(slots: ExpertSlots, local_slot: int) -> torch.Tensor:
    return torch.cat([slots.w1[local_slot].flatten(), slots.w3[local_slot].flatten(), slots.w2[local_slot].flatten()])


def _unpack(buffer: torch.Tensor, weights: list[torch.Tensor], local_slot: int) -> None:
    start = 0
    for tensor in weights:
        size = tensor[local_slot].numel()
        tensor[local_slot] = buffer[start:start + size].view_as(tensor[local_slot])
        start += size
