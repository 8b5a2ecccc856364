"""Expert parallelism over torch.distributed (gloo on the CPU, NCCL on GPUs).

Rank 0 is the process that owns the Engine (scheduler, API, drafter). Ranks 1..N-1 are spawned workers: each
loads the target, keeps only its own expert slots, and mirrors every target forward that rank 0 announces over
a pipe (the batch's chunks and the capacity factor), so dense layers and the KV cache are replicated while the
MoE layers exchange (token, choice) pairs with all_to_all_single. Commands travel over pipes, not collectives,
so an idle server never trips a collective timeout; collectives carry the timeout that bounds a crashed peer.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.batch import SequenceChunk, build_forward_batch
from engine.experts import ExpertRuntime, drop_logical_experts, expert_topology
from engine.kv_cache import KVCache
from engine.limits import EngineLimits
from engine.placement import Topology
from engine.transformer import Transformer

DEFAULT_TIMEOUT_SECONDS = 60.0

TargetLoader = Callable[[torch.device, torch.dtype], Transformer]
"""Loads the target model onto a device in a dtype; a spawned rank unpickles it, so it must be picklable."""


class ExpertParallelError(RuntimeError):
    """A worker rank failed to start, died, or stopped answering."""
    cause = "expert_parallel_rank_failed"


class GroupExchange:
    """Pair rows between the ranks of the default process group; times every collective it runs."""

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
        with self._collective("expert weight transfer"):
            pending = [dist.isend(tensor.contiguous(), peer, tag=tag) for tensor, peer, tag in sends]
            pending += [dist.irecv(tensor, peer, tag=tag) for tensor, peer, tag in receives]
            for request in pending:
                request.wait()

    def take_seconds(self) -> float:
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    @contextlib.contextmanager
    def _collective(self, name: str):
        """Time the exchange; a dead or silent peer becomes an ExpertParallelError."""
        started = time.perf_counter()
        try:
            yield
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except RuntimeError as error:
            raise ExpertParallelError(f"rank {self.rank}: {name} failed (a peer rank died or timed out): "
                                      f"{error}") from error
        self._seconds += time.perf_counter() - started


class ExpertParallel:
    """Rank 0's handle on a group of `ranks` processes serving one MoE target."""

    def __init__(self, loader: TargetLoader, ranks: int, target: Transformer, limits: EngineLimits,
                 redundant_experts: int = 0, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS):
        """Spawn ranks 1..ranks-1 (each loads the target itself with `loader`) and join them as rank 0 of the
        default group."""
        if ranks < 2:
            raise ValueError(f"expert parallelism needs at least 2 ranks, got {ranks}")
        if dist.is_initialized():
            raise ExpertParallelError("this process already belongs to a process group; one expert-parallel "
                                      "group per process")
        if not target.moe_blocks:
            raise ValueError("expert parallelism needs an MoE target; this one is dense")
        parameter = next(target.parameters())
        device, dtype = parameter.device, parameter.dtype
        if device.type == "cuda" and ranks > torch.cuda.device_count():
            raise ValueError(f"--ep {ranks} needs one GPU per rank; this machine has {torch.cuda.device_count()}")
        self.topology = expert_topology(target.spec.num_experts, ranks, redundant_experts)
        self.timeout_seconds = timeout_seconds
        backend = "nccl" if device.type == "cuda" else "gloo"
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        context = mp.get_context("spawn")
        self._pipes, self._workers = [], []
        threads = max(1, (os.cpu_count() or 1) // ranks)
        for rank in range(1, ranks):
            ours, theirs = context.Pipe()
            worker = context.Process(
                target=_serve_rank, name=f"governor-ep-rank{rank}", daemon=True,
                args=(rank, ranks, backend, init_method, loader, self.topology, limits,
                      str(_rank_device(device, rank)), dtype, threads, timeout_seconds, theirs))
            worker.start()
            theirs.close()
            self._pipes.append(ours)
            self._workers.append(worker)
        try:
            dist.init_process_group(backend, init_method=init_method, rank=0, world_size=ranks,
                                    timeout=timedelta(seconds=timeout_seconds))
            for rank in range(1, ranks):
                self._answer(rank)
        except Exception:
            self.close()
            raise
        self.exchange = GroupExchange(0, ranks, device)

    @property
    def ranks(self) -> int:
        return self.topology.devices

    @property
    def worker_pids(self) -> list[int]:
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
        return [self._answer(rank) for rank in range(1, self.ranks)]

    def dead_ranks(self) -> dict[int, int | None]:
        """Worker rank -> exit code, for every worker that is no longer running."""
        return {rank: worker.exitcode for rank, worker in enumerate(self._workers, start=1) if not worker.is_alive()}

    def abort(self) -> None:
        """Tear the group down at once: kill every worker (one may be stuck in a collective) and leave the group."""
        for worker in self._workers:
            if worker.is_alive():
                worker.kill()
        for worker in self._workers:
            worker.join(timeout=10)
        for pipe in self._pipes:
            pipe.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        self._pipes, self._workers = [], []

    def close(self) -> None:
        """Stop the workers (terminating any that do not stop in time) and leave the process group."""
        for pipe in self._pipes:
            try:
                pipe.send(("stop",))
            except OSError:
                pass
        if dist.is_initialized():
            dist.destroy_process_group()
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
        self._pipes, self._workers = [], []

    def _send(self, command: tuple) -> None:
        for rank, (pipe, worker) in enumerate(zip(self._pipes, self._workers), start=1):
            if not worker.is_alive():
                raise ExpertParallelError(f"expert-parallel rank {rank} exited (code {worker.exitcode})")
            try:
                pipe.send(command)
            except OSError as error:
                raise ExpertParallelError(f"expert-parallel rank {rank} is gone: {error}") from error

    def _answer(self, rank: int):
        pipe = self._pipes[rank - 1]
        if not pipe.poll(self.timeout_seconds):
            raise ExpertParallelError(f"expert-parallel rank {rank} did not answer within {self.timeout_seconds} s")
        try:
            reply = pipe.recv()
        except EOFError as error:
            raise ExpertParallelError(f"expert-parallel rank {rank} exited") from error
        if isinstance(reply, BaseException):
            raise ExpertParallelError(f"expert-parallel rank {rank} failed: {reply!r}")
        return reply


def _serve_rank(rank: int, world: int, backend: str, init_method: str, loader: TargetLoader, topology: Topology,
                limits: EngineLimits, device: str, dtype: torch.dtype, threads: int, timeout_seconds: float,
                pipe) -> None:
    """A worker rank: hold its expert slots and mirror rank 0's target forwards until told to stop."""
    torch.set_num_threads(threads)
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_seconds))
    try:
        target = loader(device, dtype)
        experts = ExpertRuntime(target, topology, GroupExchange(rank, world, device))
        drop_logical_experts(target)
        cache = KVCache(target.spec, limits.num_blocks * limits.block_size, dtype, device)
    except Exception as error:
        pipe.send(error)
        raise
    pipe.send("ready")
    while True:
        try:
            command = pipe.recv()
        except EOFError:
            break  # rank 0 is gone
        if command[0] == "forward":
            _, chunks, experts.capacity_factor = command
            target(build_forward_batch(chunks, limits.block_size, device), cache, experts)
            experts.take_counts()
        elif command[0] == "place":
            experts.replace(command[1])
        elif command[0] == "describe":
            pipe.send(experts.describe())
        else:
            break
    dist.destroy_process_group()


def _rank_device(device: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device.type == "cuda" else device


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
