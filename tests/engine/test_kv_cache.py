"""The paged KV cache: block allocation, rollback of rejected drafts without copying, blocks back in the pool."""
import pytest

from engine.model.kv_cache import BlockAllocator, OutOfBlocks
from engine.runtime.delivery import Failure
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import GREEDY, code_prompts, make_engine


def test_grow_allocates_whole_blocks_and_release_returns_them():
    allocator = BlockAllocator(num_blocks=8, block_size=16)
    table: list[int] = []
    allocator.grow(table, 33)
    assert len(table) == 3 and allocator.num_free == 5
    allocator.grow(table, 48)
    assert len(table) == 3
    allocator.release(table)
    assert table == [] and allocator.num_free == 8


def test_grow_beyond_the_pool_raises_and_changes_nothing():
    allocator = BlockAllocator(num_blocks=2, block_size=16)
    table = [0]
    with pytest.raises(OutOfBlocks):
        allocator.grow(table, 100)
    assert table == [0] and allocator.num_free == 2


def test_can_grow_says_whether_grow_would_succeed():
    allocator = BlockAllocator(num_blocks=4, block_size=16)
    table: list[int] = []
    assert allocator.can_grow(table, 64) and not allocator.can_grow(table, 65)
    allocator.grow(table, 40)
    assert allocator.num_free == 1
    assert allocator.can_grow(table, 64) and not allocator.can_grow(table, 65)
    assert len(table) == 3 and allocator.num_free == 1   # asking took nothing


def test_rejected_drafts_roll_back_by_position_only(moe_models):
    engine = make_engine(moe_models, EngineConfig(draft_len=8))
    prompt = code_prompts(moe_models.tokenizer, 1)[0]
    seq = engine.add_request("r", prompt, GREEDY)
    engine.step()
    while not seq.finished and seq.num_output < 8:
        cache_before = engine.cache.k.data_ptr()
        tokens_before = len(seq.tokens)
        engine.step()
        assert engine.cache.k.data_ptr() == cache_before
        assert seq.num_computed == len(seq.tokens) - 1
        assert len(seq.tokens) - tokens_before <= 9
        assert len(seq.block_table) == engine.allocator.blocks_for(tokens_before + 8) or seq.finished


def test_every_block_returns_after_finishes_cancellations_and_failures(moe_models):
    engine = make_engine(moe_models, EngineConfig(draft_len=4))
    prompts = code_prompts(moe_models.tokenizer, 12)
    long = SamplingParams(max_tokens=40, temperature=0.7, seed=3, stop=("\n\n",))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, long)
    for _ in range(3):
        engine.step()
    assert engine.abort("0") and engine.abort("5") and engine.abort("11")
    assert not engine.abort("no-such-request")
    for _ in range(2):
        engine.step()
    engine.fail_all(Failure("test", "every request ends"))
    assert not engine.has_work
    assert engine.allocator.num_free == engine.allocator.num_blocks
    for i, prompt in enumerate(prompts[:4]):
        engine.add_request(f"again-{i}", prompt, GREEDY)
    while engine.has_work:
        engine.step()
    assert engine.allocator.num_free == engine.allocator.num_blocks
