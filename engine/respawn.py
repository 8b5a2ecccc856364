"""Rank 0's recovery of an expert-parallel group: tear the group down, spawn it again, and resume serving with the
config in use. It needs only a way to spawn a group and a way to give rank 0 back its expert weights, so it does
not depend on how workers are started. A group torchrun launched is not rank 0's to respawn: its recovery gives up at
once, so that `governor serve` exits non-zero and torchrun (--max-restarts) restarts the whole group.

Requests in flight when a rank fails are failed by the caller (engine.server.service) before recovery starts; a
step that failed on rank 0 is recovered the same way, since its workers may be stuck half way through a forward.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from engine.engine import Engine
from engine.moe.ep import ExpertParallel, TargetLoader
from engine.runtime.limits import EngineLimits

log = logging.getLogger(__name__)
MAX_FAILED_RESPAWNS = 3
FAILED_RESPAWN_PERIOD_SECONDS = 60.0


class RespawnsExhausted(RuntimeError):
    """Too many respawns failed in a short time, or the group is torchrun's to restart: only a restart of the whole
    process can help."""


class RespawnBudget:
    """Allows max_failures failed respawns within any period_seconds."""

    def __init__(self, max_failures: int = MAX_FAILED_RESPAWNS, period_seconds: float = FAILED_RESPAWN_PERIOD_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.max_failures, self.period_seconds, self._clock = max_failures, period_seconds, clock
        self._failures: deque[float] = deque()

    def spend(self) -> bool:
        """Record a failed respawn; False once max_failures fell within the period."""
        now = self._clock()
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.period_seconds:
            self._failures.popleft()
        return len(self._failures) < self.max_failures


class GroupRecovery:
    """spawn() starts a new group; restore_experts() puts the logical expert weights back on rank 0's target.
    Without spawn (a group torchrun launched), recover() tears the group down and raises RespawnsExhausted."""

    def __init__(self, engine: Engine, spawn: Callable[[], ExpertParallel] | None,
                 restore_experts: Callable[[], None],
                 budget: RespawnBudget | None = None, retry_wait_seconds: float = 1.0):
        self.engine, self._spawn, self._restore = engine, spawn, restore_experts
        self.budget = budget or RespawnBudget()
        self.retry_wait_seconds = retry_wait_seconds
        self.respawns = 0
        self._respawning: str | None = None
        self._lock = threading.Lock()

    def fault(self) -> str | None:
        """Why the group cannot serve now (a rank exited, or a respawn is under way), or None."""
        with self._lock:
            if self._respawning is not None:
                return f"respawning the expert-parallel group after: {self._respawning}"
        group = self.engine.ep
        dead = group.dead_ranks() if group is not None else {}
        if dead:
            return "; ".join(f"expert-parallel rank {rank} " + (f"exited (code {code})" if code is not None else
                                                                 "is lost (its heartbeat stopped)")
                             for rank, code in dead.items())
        return None

    def recover(self, reason: str) -> None:
        """Tear down, respawn and resume; retried until it works or the budget is spent (RespawnsExhausted)."""
        with self._lock:
            self._respawning = reason
        log.error("expert-parallel group failed (%s)%s", reason, "; respawning it" if self._spawn else "")
        try:
            self._tear_down()
            if self._spawn is None:
                raise RespawnsExhausted(f"the expert-parallel group failed ({reason}); torchrun launched it, so "
                                        "this rank exits for torchrun to restart the group (see --max-restarts)")
            while not self._respawn_once():
                if not self.budget.spend():
                    raise RespawnsExhausted(f"{self.budget.max_failures} respawns of the expert-parallel group "
                                            f"failed within {self.budget.period_seconds:g} s (the group first "
                                            f"failed: {reason})")
                time.sleep(self.retry_wait_seconds)
        finally:
            with self._lock:
                self._respawning = None

    def _respawn_once(self) -> bool:
        started = time.monotonic()
        group = None
        try:
            self._restore()
            group = self._spawn()
            self.engine.attach_group(group)
        except Exception:
            log.exception("respawning the expert-parallel group failed")
            if group is not None:
                group.abort()
            self.engine.ep = None
            return False
        self.respawns += 1
        log.warning("expert-parallel group respawned in %.1f s (respawn %d)", time.monotonic() - started,
                    self.respawns)
        return True

    def _tear_down(self) -> None:
        if self.engine.ep is not None:
            self.engine.ep.abort()
            self.engine.ep = None


def expert_parallel_recovery(engine: Engine, loader: TargetLoader, ranks: int, limits: EngineLimits,
                             redundant_experts: int = 0) -> GroupRecovery:
    """Recovery for an engine that build_engine gave ranks expert-parallel ranks loading their target with loader."""
    parameter = next(engine.target.parameters())

    def restore_experts() -> None:
        fresh = loader(parameter.device, parameter.dtype)
        for block, source in zip(engine.target.moe_blocks, fresh.moe_blocks):
            block.w1, block.w3, block.w2 = source.w1, source.w3, source.w2

    def spawn() -> ExpertParallel:
        return ExpertParallel(loader, ranks, engine.target, limits, redundant_experts=redundant_experts)

    return GroupRecovery(engine, spawn, restore_experts)


def torchrun_recovery(engine: Engine) -> GroupRecovery:
    """Recovery for rank 0 of a group torchrun launched: report the failure, then give up (torchrun restarts)."""
    return GroupRecovery(engine, None, lambda: None)
