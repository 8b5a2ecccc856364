"""An engine built for serving with --ep 2: rank 0 keeps only its slots, and a dead worker fails steps, never hangs.

Its own module: one expert-parallel group per process, and test_moe_ep's groups live for their whole module.
"""
import os
import signal

import pytest
import torch

from engine.ep import ExpertParallelError
from engine.factory import build_engine
from engine.limits import EngineLimits
from governor.loaders import load_models
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts

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


def test_a_dead_worker_fails_the_step_instead_of_hanging(served):
    models, engine = served
    engine.add_request("0", code_prompts(models.tokenizer, 1, max_bytes=60)[0], PARAMS)
    engine.step()
    os.kill(engine.ep.worker_pids[0], signal.SIGKILL)
    with pytest.raises(ExpertParallelError, match="rank"):
        for _ in range(PARAMS.max_tokens):
            engine.step()
    assert [e.finish_reason for e in engine.fail_all()] == ["error"]
