"""Expert parallelism over gloo on the CPU: 2 and 4 real ranks give the single-process outputs."""
import pytest
import torch

from engine.engine import Engine
from engine.model.batch import SequenceChunk, build_forward_batch
from engine.moe.ep import ExpertParallel
from engine.runtime.limits import EngineLimits
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, generate

LIMITS = EngineLimits(kv_cache_tokens=2048)
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SPECULATIVE = EngineConfig(spec_method="draft_model", draft_len=3, capacity_factor=1.0)


@pytest.fixture(scope="module")
def prompts(moe_models):
    return code_prompts(moe_models.tokenizer, 3, max_bytes=80)


def single_process(moe_models, config: EngineConfig) -> Engine:
    return Engine(moe_models.target, moe_models.tokenizer, moe_models.draft, config, LIMITS)


def prefill_logits(engine: Engine, prompts: list[list[int]]) -> torch.Tensor:
    """Logits of every prompt position from one target forward, on fresh cache blocks; the forward's expert counts
    and communication time are taken, so the engine's next step does not report them as its own."""
    chunks, first_block = [], 0
    for prompt in prompts:
        blocks = engine.allocator.blocks_for(len(prompt))
        chunks.append(SequenceChunk(prompt, 0, list(range(first_block, first_block + blocks)), 0))
        first_block += blocks
    if engine.ep is not None:
        engine.ep.forward(chunks, engine.config.capacity_factor)
    logits = engine.target(build_forward_batch(chunks, LIMITS.block_size, engine.device), engine.cache, engine.experts)
    if engine.experts is not None:
        engine.experts.take_counts()
    return logits


@pytest.fixture(scope="module", params=[(2, 2), (4, 0)], ids=["2-ranks-2-spare-slots", "4-ranks"])
def ep_engine(request, moe_models):
    ranks, spares = request.param
    ep = ExpertParallel(moe_models.target_loader, ranks, moe_models.target, LIMITS, redundant_experts=spares)
    engine = Engine(moe_models.target, moe_models.tokenizer, moe_models.draft, SPECULATIVE, LIMITS, ep=ep)
    yield engine
    engine.close()


def test_logits_equal_the_single_process_logits(moe_models, prompts, ep_engine):
    expected = prefill_logits(single_process(moe_models, SPECULATIVE), prompts)
    torch.testing.assert_close(prefill_logits(ep_engine, prompts), expected, rtol=1e-4, atol=1e-4)


def test_greedy_tokens_equal_the_single_process_tokens(moe_models, prompts, ep_engine):
    expected = generate(single_process(moe_models, SPECULATIVE), prompts, PARAMS)
    ep_engine.snapshot()
    assert generate(ep_engine, prompts, PARAMS) == expected
    window = ep_engine.snapshot()
    ranks = ep_engine.ep.ranks
    assert window.all_to_all_seconds > 0 and 0 < window.comm_share < 1
    assert [len(row) for row in window.rank_tokens] == [ranks] * len(moe_models.target.moe_blocks)
    assert all(min(row) > 0 for row in window.rank_tokens)
    mean_over_ranks = sum(sum(row) / ranks for row in window.rank_tokens)
    assert window.balancedness == pytest.approx(mean_over_ranks / sum(max(row) for row in window.rank_tokens))
    assert window.capacity_factor == 1.0
    for routed, computed, dropped in zip(window.expert_tokens, window.slot_tokens, window.dropped_per_layer):
        assert sum(routed) == sum(computed) + dropped


def test_each_worker_rank_holds_only_its_own_slots(moe_models, ep_engine):
    spd, block = ep_engine.experts.topology.slots_per_device, moe_models.target.moe_blocks[0]
    per_slot = block.w1[0].numel() + block.w3[0].numel() + block.w2[0].numel()
    for held in ep_engine.ep.describe():
        rank = held["rank"]
        assert held["slots"] == [phy2log[rank * spd:(rank + 1) * spd] for phy2log in ep_engine.experts.placement]
        assert held["expert_parameters"] == len(moe_models.target.moe_blocks) * spd * per_slot


def test_live_replacement_moves_weights_between_ranks_and_keeps_outputs(moe_models, prompts, ep_engine):
    topology = ep_engine.experts.topology
    experts = moe_models.target.spec.num_experts
    # reversed expert order, the spare slots replicating the last experts: every rank gets others' weights
    placement = [[experts - 1 - (slot % experts) for slot in range(topology.num_slots)]
                 for _ in moe_models.target.moe_blocks]
    expected = generate(single_process(moe_models, SPECULATIVE), prompts, PARAMS)
    for i, prompt in enumerate(prompts):
        ep_engine.add_request(str(i), prompt, PARAMS)
    outputs: dict[str, list[int]] = {}
    steps = 0
    while ep_engine.has_work:
        if steps == 2:
            ep_engine.apply(SPECULATIVE.changed(placement=placement, version=1))
        for emission in ep_engine.step():
            outputs.setdefault(emission.request_id, []).extend(emission.token_ids)
        steps += 1
    assert [outputs[str(i)] for i in range(len(prompts))] == expected
    window = ep_engine.snapshot()
    assert ep_engine.experts.placement == placement and window.replacement_seconds > 0
    assert 0 < window.comm_share < 1, "the weight moves are replacement time, not step time"
    spd = topology.slots_per_device
    assert [held["slots"] for held in ep_engine.ep.describe()] == [
        [phy2log[rank * spd:(rank + 1) * spd] for phy2log in placement] for rank in range(1, topology.devices)]
