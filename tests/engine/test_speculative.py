"""Speculative decoding is lossless: greedy output equals plain decoding token for token."""
import pytest

from seam import EngineConfig
from tests.engine.helpers import code_prompts, generate, make_engine

PROMPTS = 50
ALONE = 12      # prompts for batch size 1: one at a time, each costs as many engine steps as a batch of 8


@pytest.fixture(scope="module")
def prompts(moe_models):
    return code_prompts(moe_models.tokenizer, PROMPTS)


@pytest.fixture(scope="module")
def plain_outputs(moe_models, prompts):
    return generate(make_engine(moe_models, EngineConfig(spec_method="off", draft_len=0)), prompts, batch_size=8)


@pytest.mark.parametrize("batch_size", [1, 8])
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_draft_model_output_equals_plain(moe_models, prompts, plain_outputs, k, batch_size):
    engine = make_engine(moe_models, EngineConfig(spec_method="draft_model", draft_len=k))
    n = ALONE if batch_size == 1 else PROMPTS
    assert generate(engine, prompts[:n], batch_size=batch_size) == plain_outputs[:n]
    assert engine.snapshot().drafted_tokens > 0


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_ngram_output_equals_plain(moe_models, prompts, plain_outputs, k):
    engine = make_engine(moe_models, EngineConfig(spec_method="ngram", draft_len=k))
    assert generate(engine, prompts, batch_size=8) == plain_outputs
    assert engine.snapshot().drafted_tokens > 0


def test_draft_len_zero_is_plain_decoding_on_the_same_path(moe_models, prompts, plain_outputs):
    engine = make_engine(moe_models, EngineConfig(spec_method="draft_model", draft_len=0))
    assert generate(engine, prompts, batch_size=8) == plain_outputs
    window = engine.snapshot()
    assert window.drafted_tokens == 0 and window.draft_forward_seconds == 0


def test_shipped_draft_acceptance_on_held_out_code_is_at_least_0_6_at_k4(moe_models):
    from governor.training.data import stdlib_files

    heldout = [path.read_bytes()[:160].decode("utf-8", "ignore") for path in stdlib_files("heldout")[:24]]
    prompts = [moe_models.tokenizer.encode(text) for text in heldout if text]
    engine = make_engine(moe_models, EngineConfig(spec_method="draft_model", draft_len=4))
    generate(engine, prompts, batch_size=8)
    assert engine.snapshot().acceptance_rate >= 0.6
