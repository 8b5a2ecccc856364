import pytest

from controller import Controller, InProcessClient, Store
from policies import parse_policy
from seam import EngineConfig
from tests.engine.helpers import code_prompts, make_engine


@pytest.fixture(scope="session")
def prompts(moe_models):
    return code_prompts(moe_models.tokenizer, 16)


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'governor.db'}"


@pytest.fixture
def build(moe_models, db_url):
    """build(policy_dict, k, method) -> (engine, controller): a fresh engine drafting k tokens with method (plain
    decoding if k is 0) under a fresh controller."""
    def make(policy: dict, k: int = 1, url: str = db_url, method: str = "draft_model"):
        engine = make_engine(moe_models, EngineConfig(spec_method=method if k else "off", draft_len=k))
        return engine, Controller(InProcessClient(engine), Store(url), parse_policy(policy, "test-policy"))
    return make


def fast_policy(**sections) -> dict:
    """Short windows for tests: 1 s, judged whole (one check), mode probes only when asked for, short switchback
    trials (blocks of 2 steps, a look every 6 pairs, at most 48 blocks)."""
    base = {"window": {"seconds": 1.0, "checks": 1, "min_emitted_tokens": 50, "min_steps": 5},
            "speculation": {"reprobe_windows": 1000}, "trial": {"cooldown_windows": 0},
            "judge": {"block_steps": 2, "min_samples": 6, "max_blocks": 48}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base
