"""An engine built for serving with --ep 2: rank 0 keeps only its slots; a dead worker fails steps, never hangs, and
the group is respawned to serve the single process's tokens under the config in use (a non-identity placement).

Its own module: one expert-parallel group per process, and test_moe_ep's groups live for their whole module.
"""
import os
import signal
import time

import pytest
import torch

from engine.engine import Engine
from engine.factory import build_engine
from engine.moe.ep import ExpertParallelError
from engine.respawn import GroupRecovery, RespawnBudget, RespawnsExhausted, expert_parallel_recovery
from engine.runtime.delivery import Failure
from engine.runtime.limits import EngineLimits
from governor.loaders import load_models
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, generate

LIMITS = EngineLimits(kv_cache_tokens=1024)
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def served():
    """Its own copy of the model: build_engine frees rank 0's logical expert weights."""
    models = load_models("governor-moe", draft="none", device=torch.device("cpu"), dtype=torch.float32)
    engine = build_engine(models, EngineConfig(spec_method="off"), LIMITS, ep=2)
    yield models, engine
    engine.close()


def test_rank_zero_keeps_only_its_own_expert_slots(served):
    models, engine = served
    assert all(block.w1 is None and block.w3 is None and block.w2 is None for block in models.target.moe_blocks)
    held = [engine.experts.describe(), *engine.ep.describe()]
    assert [h["rank"] for h in held] == [0, 1]
    assert held[0]["expert_parameters"] == held[1]["expert_parameters"] > 0
    assert held[0]["slots"] == [[0, 1, 2, 3]] * len(models.target.moe_blocks)


def test_a_dead_worker_fails_the_step_and_a_respawned_group_serves_the_same_tokens(served, moe_models):
    models, engine = served
    prompts = code_prompts(models.tokenizer, 2, max_bytes=60)
    swapped = [[4, 5, 6, 7, 0, 1, 2, 3]] * len(models.target.moe_blocks)     # every expert on the other rank
    engine.apply(engine.config.changed(placement=swapped, version=7))
    engine.add_request("0", prompts[0], PARAMS)
    engine.step()
    recovery = expert_parallel_recovery(engine, models.target_loader, 2, LIMITS)
    old_worker = engine.ep.worker_pids[0]
    os.kill(old_worker, signal.SIGKILL)
    with pytest.raises(ExpertParallelError, match="rank"):
        for _ in range(PARAMS.max_tokens):
            engine.step()
    failed = engine.fail_all(Failure("expert_parallel_rank_failed", "rank 1 died", retryable=True))
    assert [(e.finish_reason, e.failure.cause) for e in failed] == [("error", "expert_parallel_rank_failed")]
    assert "rank 1 exited" in _fault_once_reaped(recovery)

    recovery.recover("rank 1 died")
    assert recovery.fault() is None and recovery.respawns == 1 and engine.ep.worker_pids[0] != old_worker
    assert engine.config.version == 7 and engine.experts.placement == swapped
    assert engine.ep.describe()[0]["slots"] == [[0, 1, 2, 3]] * len(swapped)      # rank 1 holds slots 4..7
    reference = Engine(moe_models.target, moe_models.tokenizer, None, EngineConfig(spec_method="off"), LIMITS)
    assert generate(engine, prompts, PARAMS) == generate(reference, prompts, PARAMS)


def _fault_once_reaped(recovery: GroupRecovery, timeout: float = 10.0) -> str | None:
    """The step can fail on the dead rank's reset connection a moment before the kernel reports the rank exited."""
    deadline = time.monotonic() + timeout
    while recovery.fault() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return recovery.fault()


def test_respawns_that_keep_failing_give_up_once_the_budget_is_spent(served):
    _, engine = served
    clock = iter(range(100)).__next__
    attempts = []

    def spawn():
        attempts.append(clock())
        raise ExpertParallelError("rank 1 failed to start")

    recovery = GroupRecovery(engine, spawn, lambda: None, RespawnBudget(3, 60.0, clock), retry_wait_seconds=0)
    group = engine.ep
    try:
        engine.ep = None
        with pytest.raises(RespawnsExhausted, match="3 respawns"):
            recovery.recover("test")
    finally:
        engine.ep = group
    assert len(attempts) == 3 and recovery.fault() is None
