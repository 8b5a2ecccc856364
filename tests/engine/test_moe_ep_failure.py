"""A worker rank that dies makes steps fail with an error, never hang the server."""
import os
import signal

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import Engine, EngineLimits
from engine.ep import ExpertParallel, ExpertParallelError
from tests.engine.helpers import code_prompts

LIMITS = EngineLimits(kv_cache_tokens=1024)
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def test_a_dead_worker_fails_the_step_instead_of_hanging(moe_models):
    ep = ExpertParallel("governor-moe", 2, moe_models.target, LIMITS, timeout_seconds=20)
    engine = Engine(moe_models.target, moe_models.tokenizer, None, EngineConfig(spec_method="off"), LIMITS, ep=ep)
    try:
        engine.add_request("0", code_prompts(moe_models.tokenizer, 1, max_bytes=60)[0], PARAMS)
        engine.step()
        os.kill(ep.worker_pids[0], signal.SIGKILL)
        with pytest.raises(ExpertParallelError, match="rank"):
            for _ in range(PARAMS.max_tokens):
                engine.step()
        assert [e.finish_reason for e in engine.fail_all()] == ["error"]
    finally:
        engine.close()
