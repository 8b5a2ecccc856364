"""How the ranks of an expert-parallel group find each other and how rank 0 tells the workers what to do.

A rank joins through a rendezvous: torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
when torchrun launched it, or a loopback address when `--ep N` spawned it. Rank 0 broadcasts every command (a
forward's chunks, a new placement, stop) over a gloo group that never times out, so an idle server never trips a
collective timeout, and gathers the workers' replies over a second gloo group that does. Workers bump a heartbeat
counter in the rendezvous store, so rank 0 sees a lost rank while idle, wherever that rank runs.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

IDLE_TIMEOUT = timedelta(days=365)     # a worker may wait this long for rank 0's next command
HEARTBEAT_SECONDS = 1.0
STALE_HEARTBEAT_SECONDS = 10.0         # a rank silent this long is reported lost
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankLaunchError(ValueError):
    """torchrun's environment is incomplete or does not describe an expert-parallel group."""


@dataclass(frozen=True)
class GroupMember:
    """This process's place in an expert-parallel group and the rendezvous that joins it (a torch.distributed
    init_method: "env://" under torchrun, "tcp://host:port" for ranks spawned on one machine)."""
    rank: int
    world: int
    local_rank: int
    init_method: str

    @classmethod
    def from_torchrun(cls, environ: Mapping[str, str] = os.environ) -> GroupMember | None:
        """The member torchrun launched this process as; None when torchrun did not launch it."""
        if "TORCHELASTIC_RUN_ID" not in environ and "RANK" not in environ:
            return None
        missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
        if missing:
            raise RankLaunchError(f"launched as a distributed rank, but {', '.join(missing)} is not set")
        member = cls(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ["LOCAL_RANK"]), "env://")
        if member.world < 2:
            raise RankLaunchError(f"torchrun started a group of {member.world} rank; expert parallelism needs at "
                                  "least 2 (run without torchrun for one process)")
        return member

    @property
    def address(self) -> str:
        """Where the rendezvous is, for messages."""
        if self.init_method == "env://":
            return f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        return self.init_method.removeprefix("tcp://")

    def join(self, backend: str, timeout_seconds: float) -> CommandChannel:
        """Join the default process group (backend for the tensors) and open the command channel on it."""
        store, _, _ = next(dist.rendezvous(self.init_method, self.rank, self.world,
                                           timeout=timedelta(seconds=timeout_seconds)))
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=timeout_seconds))
        return CommandChannel(self.rank, self.world, store, timeout_seconds)


class CommandChannel:
    """Rank 0 sends, every worker receives; replies are gathered to rank 0."""

    def __init__(self, rank: int, world: int, store: dist.Store, timeout_seconds: float):
        self.rank, self.world, self._store = rank, world, store
        self._commands = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        self._replies = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_seconds))
        self._beats: dict[int, tuple[int, float]] = {}     # rank -> (last count seen, when it was seen)
        self._checked = 0.0
        self._lock = threading.Lock()     # the engine thread and the health probes both ask

    def send(self, command: tuple) -> None:
        """Rank 0: every worker's next receive() returns command."""
        dist.broadcast_object_list([command], src=0, group=self._commands)

    def receive(self) -> tuple:
        """A worker: wait, without a time limit, for rank 0's next command."""
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self._commands)
        return box[0]

    def gather(self, reply=None) -> list:
        """Every rank calls this; rank 0 gets the workers' replies in rank order (ranks 1..world-1)."""
        replies = [None] * self.world if self.rank == 0 else None
        dist.gather_object(reply, replies, dst=0, group=self._replies)
        return replies[1:] if self.rank == 0 else []

    def start_heartbeat(self) -> Heartbeat:
        """A worker: bump this rank's counter in the rendezvous store until the heartbeat is stopped."""
        return Heartbeat(self._store, self.rank)

    def silent_ranks(self) -> list[int]:
        """Rank 0: workers whose heartbeat has not moved for STALE_HEARTBEAT_SECONDS (checked once a beat)."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= HEARTBEAT_SECONDS:
                self._checked = now
                for rank in range(1, self.world):
                    count = self._store.add(_heartbeat_key(rank), 0)
                    if self._beats.get(rank, (None,))[0] != count:
                        self._beats[rank] = (count, now)
            return [rank for rank, (_, seen) in self._beats.items() if now - seen > STALE_HEARTBEAT_SECONDS]


class Heartbeat:
    """A thread that bumps a rank's counter in the store every HEARTBEAT_SECONDS."""

    def __init__(self, store: dist.Store, rank: int):
        self._store, self._key = store, _heartbeat_key(rank)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"governor-ep-heartbeat{rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread: one still inside a store call when the process exits aborts it."""
        self._stop.set()
        self._thread.join(timeout=5 * HEARTBEAT_SECONDS)

    def _beat(self) -> None:
        try:
            while not self._stop.is_set():
                self._store.add(self._key, 1)
                self._stop.wait(HEARTBEAT_SECONDS)
        except RuntimeError:
            return      # the store is gone with rank 0; the command receive fails too and ends the worker


def _heartbeat_key(rank: int) -> str:
    return f"governor/ep/heartbeat/{rank}"
