"""Continuous batching: batched equals unbatched; configs change between steps without losing requests."""
from engine.runtime.limits import EngineLimits
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import GREEDY, code_prompts, generate, make_engine

SEEDED = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=1234, ignore_eos=True)


def test_greedy_batched_output_equals_unbatched(moe_models):
    prompts = code_prompts(moe_models.tokenizer, 12)
    engine = make_engine(moe_models, EngineConfig(draft_len=3))
    assert generate(engine, prompts, batch_size=12) == generate(engine, prompts, batch_size=1)


def test_seeded_sampling_is_independent_of_batching(moe_models):
    prompts = code_prompts(moe_models.tokenizer, 8)
    engine = make_engine(moe_models, EngineConfig(draft_len=3))
    assert generate(engine, prompts, SEEDED, batch_size=8) == generate(engine, prompts, SEEDED, batch_size=1)


def test_prefill_chunks_share_steps_with_decodes_under_the_token_budget(moe_models):
    prompts = code_prompts(moe_models.tokenizer, 6, max_bytes=300)
    small_budget = EngineLimits(kv_cache_tokens=8192, max_batch_tokens=48)
    engine = make_engine(moe_models, EngineConfig(draft_len=2), small_budget)
    assert generate(engine, prompts) == generate(make_engine(moe_models, EngineConfig(draft_len=2)), prompts)
    window = engine.snapshot()
    assert window.batch_size_max > 1
    assert window.prefill_tokens == sum(len(p) for p in prompts)


def test_apply_between_steps_changes_k_and_drafter_without_losing_requests(moe_models):
    prompts = code_prompts(moe_models.tokenizer, 8)
    expected = generate(make_engine(moe_models, EngineConfig(spec_method="off", draft_len=0)), prompts)
    engine = make_engine(moe_models, EngineConfig(draft_len=2))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    configs = [EngineConfig(version=1, spec_method="ngram", draft_len=5), EngineConfig(version=2, spec_method="off"),
               EngineConfig(version=3, spec_method="draft_model", draft_len=7)]
    outputs: dict[str, list[int]] = {}
    steps = 0
    while engine.has_work:
        if steps % 3 == 2 and configs:
            engine.apply(configs.pop(0))
        for emission in engine.step():
            outputs.setdefault(emission.request_id, []).extend(emission.token_ids)
        steps += 1
    assert not configs, "the run ended before every config was applied"
    assert [outputs[str(i)] for i in range(len(prompts))] == expected
    assert engine.config.version == 3


def test_preemption_under_a_tiny_cache_keeps_greedy_output(moe_models):
    prompts = code_prompts(moe_models.tokenizer, 6, max_bytes=120)
    tiny = EngineLimits(kv_cache_tokens=320, block_size=16, max_batch_tokens=256)
    engine = make_engine(moe_models, EngineConfig(draft_len=4), tiny)
    expected = generate(make_engine(moe_models, EngineConfig(draft_len=4)), prompts)
    assert generate(engine, prompts) == expected
    assert engine.scheduler.preemptions > 0
    assert engine.allocator.num_free == engine.allocator.num_blocks
