"""Expert parallelism over torch.distributed (gloo on the CPU, NCCL on GPUs).

Rank 0 is the process that owns the Engine (scheduler, API, drafter). Ranks 1..N-1 are workers, spawned here by
`--ep N` or launched by torchrun on any node: each loads the target, keeps only its own expert slots, and mirrors
every target forward that rank 0 announces over the command channel (engine.moe.ep_channel: the batch's chunks and
the capacity factor), so dense layers and the KV cache are replicated while the MoE layers exchange (token,
choice) pairs with all_to_all_single. Commands wait without a time limit, so an idle server never trips a
collective timeout; the tensor collectives carry the timeout that bounds a crashed peer.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.model.batch import SequenceChunk, build_forward_batch
from engine.model.kv_cache import KVCache
from engine.model.transformer import Transformer
from engine.moe.ep_channel import CommandChannel, GroupMember
from engine.moe.experts import ExpertRuntime, drop_logical_experts, expert_topology
from engine.runtime.limits import EngineLimits

DEFAULT_TIMEOUT_SECONDS = 60.0

TargetLoader = Callable[[torch.device, torch.dtype], Transformer]
"""Loads the target model onto a device in a dtype; rank 0 sends it to every worker, so it must be picklable."""


class ExpertParallelError(RuntimeError):
    """A worker rank failed to start, died, or stopped answering."""
    cause = "expert_parallel_rank_failed"


class GroupExchange:
    """Pair rows between the ranks of the default process group; times the collectives of forwards (weight moves
    are timed by the replacement that asks for them)."""

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank, self.world, self.device = rank, world, device
        self._seconds = 0.0

    def all_to_all(self, rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        received = rows.new_empty(sum(recv_counts), rows.shape[1])
        with self._collective("all_to_all_single"):
            dist.all_to_all_single(received, rows.contiguous(), recv_counts, send_counts)
        return received

    def all_gather(self, shard: torch.Tensor, shard_sizes: list[int]) -> torch.Tensor:
        padded = shard.new_zeros(max(shard_sizes), shard.shape[1])
        padded[:shard.shape[0]] = shard
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        with self._collective("all_gather"):
            dist.all_gather(parts, padded)
        return torch.cat([part[:size] for part, size in zip(parts, shard_sizes)])

    def move(self, sends: list[tuple[torch.Tensor, int, int]], receives: list[tuple[torch.Tensor, int, int]]) -> None:
        with self._collective("expert weight transfer", timed=False):
            pending = [dist.isend(tensor.contiguous(), peer, tag=tag) for tensor, peer, tag in sends]
            pending += [dist.irecv(tensor, peer, tag=tag) for tensor, peer, tag in receives]
            for request in pending:
                request.wait()

    def take_seconds(self) -> float:
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    @contextlib.contextmanager
    def _collective(self, name: str, timed: bool = True):
        """Time the exchange (when timed); a dead or silent peer becomes an ExpertParallelError."""
        started = time.perf_counter()
        try:
            yield
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except RuntimeError as error:
            raise ExpertParallelError(f"rank {self.rank}: {name} failed (a peer rank died or timed out): "
                                      f"{error}") from error
        if timed:
            self._seconds += time.perf_counter() - started


class ExpertParallel:
    """Rank 0's handle on a group of `ranks` processes serving one MoE target."""

    def __init__(self, loader: TargetLoader, ranks: int, target: Transformer, limits: EngineLimits,
                 redundant_experts: int = 0, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
                 member: GroupMember | None = None):
        """Join the group as its rank 0 and have every worker load the target with `loader`. member: the place
        torchrun launched this process in (its workers run `serve_worker` on whichever node); None spawns ranks
        1..ranks-1 here, on a loopback rendezvous."""
        if ranks < 2:
            raise ValueError(f"expert parallelism needs at least 2 ranks, got {ranks}")
        if dist.is_initialized():
            raise ExpertParallelError("this process already belongs to a process group; one expert-parallel "
                                      "group per process")
        if not target.moe_blocks:
            raise ValueError("expert parallelism needs an MoE target; this one is dense")
        if member is not None and (member.rank, member.world) != (0, ranks):
            raise ValueError(f"rank 0 of {ranks} ranks cannot serve as rank {member.rank} of {member.world}")
        parameter = next(target.parameters())
        device, dtype = parameter.device, parameter.dtype
        if member is None and device.type == "cuda" and ranks > torch.cuda.device_count():
            raise ValueError(f"--ep {ranks} needs one GPU per rank; this machine has {torch.cuda.device_count()}")
        self.topology = expert_topology(target.spec.num_experts, ranks, redundant_experts)
        self.timeout_seconds = timeout_seconds
        backend = "nccl" if device.type == "cuda" else "gloo"
        self._workers: list[mp.Process] = []
        if member is None:
            member = GroupMember(0, ranks, 0, f"tcp://127.0.0.1:{_free_port()}")
            self._workers = _spawn_workers(member, backend, timeout_seconds)
        self._channel: CommandChannel | None = None
        try:
            self._channel = member.join(backend, timeout_seconds)
            self._send(("setup", loader, self.topology, limits, device.type, dtype))
            self._answers()
        except Exception as error:
            self.abort()
            if isinstance(error, RuntimeError) and not isinstance(error, ExpertParallelError):
                raise ExpertParallelError(f"the expert-parallel group at {member.address} did not start: "
                                          f"{error}") from error
            raise
        self.exchange = GroupExchange(0, ranks, device)

    @property
    def ranks(self) -> int:
        return self.topology.devices

    @property
    def worker_pids(self) -> list[int]:
        """The workers this process spawned (none under torchrun)."""
        return [worker.pid for worker in self._workers]

    def forward(self, chunks: list[SequenceChunk], capacity_factor: float) -> None:
        """Announce a target forward; the caller then runs it on rank 0 with the same chunks."""
        self._send(("forward", chunks, capacity_factor))

    def replace(self, placement: list[list[int]]) -> None:
        """Announce a new placement; the caller then runs ExpertRuntime.replace on rank 0."""
        self._send(("place", placement))

    def describe(self) -> list[dict]:
        """What each worker rank holds: {"rank", "slots": [logical expert per own slot, per layer],
        "expert_parameters": number of expert weights it keeps}."""
        self._send(("describe",))
        return self._answers()

    def dead_ranks(self) -> dict[int, int | None]:
        """Worker rank -> exit code (None where unknown, e.g. a rank on another node whose heartbeat stopped), for
        every worker that is no longer running."""
        dead = {rank: worker.exitcode for rank, worker in enumerate(self._workers, start=1)
                if not worker.is_alive()}
        channel = self._channel
        silent = channel.silent_ranks() if channel is not None else []
        return dead | {rank: None for rank in silent if rank not in dead}

    def abort(self) -> None:
        """Tear the group down at once: kill the workers spawned here (one may be stuck in a collective) and leave
        the group."""
        for worker in self._workers:
            if worker.is_alive():
                worker.kill()
        for worker in self._workers:
            worker.join(timeout=10)
        self._leave()
        self._workers = []

    def close(self) -> None:
        """Stop the workers (killing any spawned here that do not stop in time) and leave the process group."""
        if self._channel is not None:
            with contextlib.suppress(RuntimeError):
                self._channel.send(("stop",))
        self._leave()
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5)
        self._workers = []

    def _leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._channel = None

    def _send(self, command: tuple) -> None:
        for rank, worker in enumerate(self._workers, start=1):
            if not worker.is_alive():
                raise ExpertParallelError(f"expert-parallel rank {rank} exited (code {worker.exitcode})")
        try:
            self._channel.send(command)
        except RuntimeError as error:
            raise ExpertParallelError(f"sending {command[0]!r} to the expert-parallel ranks failed: {error}") \
                from error

    def _answers(self) -> list:
        try:
            replies = self._channel.gather()
        except RuntimeError as error:
            raise ExpertParallelError(f"the expert-parallel ranks did not answer within {self.timeout_seconds} s: "
                                      f"{error}") from error
        for rank, reply in enumerate(replies, start=1):
            if isinstance(reply, BaseException):
                raise ExpertParallelError(f"expert-parallel rank {rank} failed: {reply!r}")
        return replies


def serve_worker(member: GroupMember, backend: str, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
    """A worker rank: join the group, hold this rank's expert slots and mirror rank 0's target forwards until rank 0
    says stop. Raises what failed (a collective when a peer died, the loader, ...), so its launcher sees it."""
    channel = member.join(backend, timeout_seconds)
    heartbeat = channel.start_heartbeat()
    try:
        _, loader, topology, limits, device_type, dtype = channel.receive()
        device = torch.device(device_type, member.local_rank) if device_type == "cuda" else torch.device(device_type)
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            target = loader(device, dtype)
            experts = ExpertRuntime(target, topology, GroupExchange(member.rank, member.world, device))
            drop_logical_experts(target)
            cache = KVCache(target.spec, limits.num_blocks * limits.block_size, dtype, device)
        except Exception as error:
            channel.gather(error)       # rank 0 reports it
            raise
        channel.gather("ready")
        _mirror(channel, target, experts, cache, limits, device)
    finally:
        heartbeat.stop()
        if dist.is_initialized():
            dist.destroy_process_group()


def _mirror(channel: CommandChannel, target: Transformer, experts: ExpertRuntime, cache: KVCache,
            limits: EngineLimits, device: torch.device) -> None:
    while True:
        command = channel.receive()
        if command[0] == "forward":
            _, chunks, experts.capacity_factor = command
            target(build_forward_batch(chunks, limits.block_size, device), cache, experts)
            experts.take_counts()
        elif command[0] == "place":
            experts.replace(command[1])
        elif command[0] == "describe":
            channel.gather(experts.describe())
        else:
            return


def _spawn_workers(rank0: GroupMember, backend: str, timeout_seconds: float) -> list[mp.Process]:
    """Ranks 1..world-1 on this machine, joining rank 0's rendezvous."""
    context = mp.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // rank0.world)
    workers = []
    for rank in range(1, rank0.world):
        member = GroupMember(rank, rank0.world, rank, rank0.init_method)
        worker = context.Process(target=_spawned_worker, name=f"governor-ep-rank{rank}", daemon=True,
                                 args=(member, backend, threads, timeout_seconds))
        worker.start()
        workers.append(worker)
    return workers


def _spawned_worker(member: GroupMember, backend: str, threads: int, timeout_seconds: float) -> None:
    """A worker rank 0 spawned lives and dies by rank 0: a SIGINT or SIGTERM sent to the whole process group (Ctrl-C,
    `timeout`) is rank 0's to act on, and rank 0 stops its workers as it shuts down. A worker that died of it first
    would make rank 0's step in flight fail and respawn the group while the server shuts down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(threads)
    serve_worker(member, backend, timeout_seconds)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
