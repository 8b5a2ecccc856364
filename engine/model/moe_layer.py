"""Mixtral-style sparse MoE: the model's block and the layer that routes, drops, dispatches and combines.

A layer's experts live in physical slots (seam.placement); slot s runs on rank s // slots_per_device. Every
rank routes the whole batch (the router is tiny, and it makes drop decisions global and identical everywhere),
then takes its own shard of tokens, sends each kept (token, choice) pair to the rank holding its slot, gets the
expert's output back and combines it with the renormalised gate weights; the shards are then gathered.
With one rank the exchanges are the identity and nothing of torch.distributed is touched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.model_spec import ModelSpec
from governor_kernels import expert_capacity, route_tokens


class Exchange(Protocol):
    """How pair rows travel between the ranks of an expert-parallel group."""
    rank: int
    world: int

    def all_to_all(self, rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor: ...

    def all_gather(self, shard: torch.Tensor, shard_sizes: list[int]) -> torch.Tensor: ...

    def move(self, sends: list[tuple[torch.Tensor, int, int]], receives: list[tuple[torch.Tensor, int, int]]) -> None:
        """Point-to-point (tensor, peer rank, tag) transfers, all in flight together."""

    def take_seconds(self) -> float:
        """Seconds spent in all_to_all and all_gather since the last take."""


class LocalExchange:
    """One rank: every slot is local."""
    rank, world = 0, 1

    def all_to_all(self, rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        return rows

    def all_gather(self, shard: torch.Tensor, shard_sizes: list[int]) -> torch.Tensor:
        return shard

    def move(self, sends: list, receives: list) -> None:
        """Nothing travels: on one rank every source slot is local."""

    def take_seconds(self) -> float:
        return 0.0


LOCAL = LocalExchange()


@dataclass
class LayerCounts:
    expert_tokens: torch.Tensor  # [experts] pairs routed to each logical expert, before any drop
    slot_tokens: torch.Tensor    # [slots] pairs each physical slot computed
    dropped: int                 # pairs dropped over capacity


def expert_ffn(h: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(h, w1)) * F.linear(h, w3), w2)


class ExpertSlots:
    """One layer's placement (phy2log over all slots) and this rank's slot weights [slots_per_device, ...]."""

    def __init__(self, phy2log: list[int], slots_per_device: int, rank: int, num_experts: int,
                 w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor):
        self.phy2log, self.slots_per_device, self.rank = list(phy2log), slots_per_device, rank
        self.w1, self.w3, self.w2 = w1, w3, w2
        replicas = [[s for s, e in enumerate(phy2log) if e == expert] for expert in range(num_experts)]
        width = max(len(r) for r in replicas)
        self.replica_count = torch.tensor([len(r) for r in replicas], device=w1.device)
        self.replicas = torch.tensor([r + [r[0]] * (width - len(r)) for r in replicas], device=w1.device)

    @classmethod
    def from_logical(cls, phy2log: list[int], slots_per_device: int, rank: int,
                     w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> ExpertSlots:
        """Copy this rank's slots out of the full logical weights [experts, ...]."""
        mine = torch.tensor(phy2log[rank * slots_per_device:(rank + 1) * slots_per_device], device=w1.device)
        return cls(phy2log, slots_per_device, rank, w1.shape[0], w1[mine], w3[mine], w2[mine])

    @property
    def num_slots(self) -> int:
        return len(self.phy2log)

    def slot_of(self, experts: torch.Tensor, queue_positions: torch.Tensor) -> torch.Tensor:
        """The physical slot serving each pair: a replicated expert's pairs alternate over its replicas."""
        return self.replicas[experts, queue_positions % self.replica_count[experts]]

    def compute(self, rows: torch.Tensor, local_slots: torch.Tensor) -> torch.Tensor:
        """Each row through its slot's expert; a slot's rows run as one batch, in their order in rows."""
        order = torch.argsort(local_slots, stable=True)
        sizes = torch.bincount(local_slots, minlength=self.slots_per_device).tolist()
        parts = [expert_ffn(part, self.w1[slot], self.w3[slot], self.w2[slot])
                 for slot, part in enumerate(rows[order].split(sizes)) if sizes[slot]]
        out = torch.empty_like(rows)
        if parts:
            out[order] = torch.cat(parts)
        return out


def moe_forward(x: torch.Tensor, gate: nn.Linear, top_k: int, slots: ExpertSlots, capacity_factor: float,
                exchange: Exchange) -> tuple[torch.Tensor, LayerCounts]:
    """x [N, d] (the whole batch, identical on every rank) -> MoE output [N, d] and what was routed."""
    n, rank, world = x.shape[0], exchange.rank, exchange.world
    routing = route_tokens(gate(x), top_k)
    capacity = expert_capacity(capacity_factor, n, top_k, gate.out_features)
    pair_slot_all = slots.slot_of(routing.experts, routing.slots).flatten()
    pair = (torch.arange(n * top_k, device=x.device) if capacity is None          # pair id = token * top_k + choice
            else (routing.slots < capacity).flatten().nonzero().squeeze(1))
    pair_slot = pair_slot_all[pair]
    counts = LayerCounts(routing.counts, torch.bincount(pair_slot, minlength=slots.num_slots),
                         n * top_k - pair.numel())

    shard_sizes = [n // world + (r < n % world) for r in range(world)]
    if world == 1:
        returned = slots.compute(x[pair // top_k], pair_slot)
    else:
        pair, returned = _exchanged_experts(x, pair, pair_slot, top_k, slots, exchange, shard_sizes)

    first = sum(shard_sizes[:rank])
    shard = shard_sizes[rank]
    per_pair = x.new_zeros(shard * top_k, x.shape[1])
    per_pair[pair - first * top_k] = returned
    gates = routing.weights[first:first + shard].to(x.dtype)
    combined = (per_pair.view(shard, top_k, x.shape[1]) * gates[..., None]).sum(dim=1)
    return exchange.all_gather(combined, shard_sizes), counts


def _exchanged_experts(x: torch.Tensor, pair: torch.Tensor, pair_slot: torch.Tensor, top_k: int, slots: ExpertSlots,
                       exchange: Exchange, shard_sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Send this rank's shard of pairs to the ranks holding their slots, compute the pairs sent here, and
    return (this shard's pair ids, their expert outputs)."""
    rank, world = exchange.rank, exchange.world
    shard_ends = torch.tensor(shard_sizes, device=x.device).cumsum(0)
    token = pair // top_k
    src = torch.bucketize(token, shard_ends, right=True)
    dest = pair_slot // slots.slots_per_device
    num_pairs = x.shape[0] * top_k
    order = torch.argsort(((dest * world + src) * slots.num_slots + pair_slot) * num_pairs + pair)
    pair, pair_slot, token, src, dest = pair[order], pair_slot[order], token[order], src[order], dest[order]

    outgoing, incoming = src == rank, dest == rank
    send_counts = torch.bincount(dest[outgoing], minlength=world).tolist()
    recv_counts = torch.bincount(src[incoming], minlength=world).tolist()
    received = exchange.all_to_all(x[token[outgoing]], send_counts, recv_counts)
    computed = slots.compute(received, pair_slot[incoming] - rank * slots.slots_per_device)
    return pair[outgoing], exchange.all_to_all(computed, recv_counts, send_counts)


class MoEBlock(nn.Module):
    """Router gate and the logical expert weights [experts, ...] as trained."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_experts, self.top_k = spec.num_experts, spec.experts_per_token
        d, f = spec.hidden_size, spec.intermediate_size
        self.gate = nn.Linear(d, spec.num_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(spec.num_experts, f, d))
        self.w3 = nn.Parameter(torch.empty(spec.num_experts, f, d))
        self.w2 = nn.Parameter(torch.empty(spec.num_experts, d, f))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Dropless, every expert on this device: the model as trained (used by drafters and parity checks)."""
        slots = ExpertSlots(list(range(self.num_experts)), self.num_experts, 0, self.num_experts,
                            self.w1, self.w3, self.w2)
        return moe_forward(x, self.gate, self.top_k, slots, 0.0, LOCAL)[0]
