"""The MoE layer against a dense reference: dropless equality, capacity, which pairs drop, residual pass-through."""
import math

import pytest
import torch

from engine.model.moe_layer import LOCAL, ExpertSlots, expert_ffn, moe_forward
from governor_kernels.router import route_tokens
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, generate, make_engine


@pytest.fixture(scope="module")
def block(moe_models):
    return moe_models.target.moe_blocks[1]


@pytest.fixture(scope="module")
def hidden(moe_models):
    torch.manual_seed(3)
    return torch.randn(40, moe_models.target.spec.hidden_size)


def identity_slots(block) -> ExpertSlots:
    return ExpertSlots(list(range(block.num_experts)), block.num_experts, 0, block.num_experts,
                       block.w1, block.w3, block.w2)


def reference(block, x: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, combined with the renormalised top-k gates of the kept pairs only."""
    routing = route_tokens(block.gate(x), block.top_k)
    every = torch.stack([expert_ffn(x, block.w1[e], block.w3[e], block.w2[e]) for e in range(block.num_experts)], 1)
    chosen = every.gather(1, routing.experts[..., None].expand(-1, -1, x.shape[1]))
    return (chosen * (routing.weights * kept)[..., None]).sum(dim=1)


def kept_by_policy(block, x: torch.Tensor, capacity: int) -> torch.Tensor:
    """The documented drop policy, spelled out: top-1 choices first, then top-2, earlier tokens first."""
    experts = route_tokens(block.gate(x), block.top_k).experts.tolist()
    taken = [0] * block.num_experts
    kept = torch.zeros(len(experts), block.top_k, dtype=torch.bool)
    for choice in range(block.top_k):
        for token, chosen in enumerate(experts):
            if taken[chosen[choice]] < capacity:
                taken[chosen[choice]] += 1
                kept[token, choice] = True
    return kept


def test_dropless_layer_equals_the_dense_top_k_reference(block, hidden):
    out, counts = moe_forward(hidden, block.gate, block.top_k, identity_slots(block), 0.0, LOCAL)
    everything = torch.ones(hidden.shape[0], block.top_k, dtype=torch.bool)
    torch.testing.assert_close(out, reference(block, hidden, everything), rtol=1e-5, atol=1e-5)
    assert counts.dropped == 0 and counts.slot_tokens.tolist() == counts.expert_tokens.tolist()
    assert int(counts.expert_tokens.sum()) == hidden.shape[0] * block.top_k


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25])
def test_pairs_over_capacity_are_dropped_by_the_documented_policy(block, hidden, capacity_factor):
    n, k, e = hidden.shape[0], block.top_k, block.num_experts
    capacity = math.ceil(capacity_factor * n * k / e)
    kept = kept_by_policy(block, hidden, capacity)
    out, counts = moe_forward(hidden, block.gate, k, identity_slots(block), capacity_factor, LOCAL)
    routed = route_tokens(block.gate(hidden), k)
    expected_kept = torch.bincount(routed.experts[kept], minlength=e)
    assert counts.slot_tokens.tolist() == expected_kept.tolist()
    assert counts.slot_tokens.max() <= capacity
    assert counts.dropped == int((~kept).sum()) == n * k - int(expected_kept.sum())
    assert counts.expert_tokens.tolist() == routed.counts.tolist()
    torch.testing.assert_close(out, reference(block, hidden, kept), rtol=1e-5, atol=1e-5)


def test_drops_happen_below_capacity_one(block, hidden):
    """The shipped router is not perfectly balanced, so cf 0.5 and 1.0 must drop something."""
    for capacity_factor in (0.5, 1.0):
        _, counts = moe_forward(hidden, block.gate, block.top_k, identity_slots(block), capacity_factor, LOCAL)
        assert counts.dropped > 0


def test_a_token_that_loses_every_expert_passes_through_as_residual(block, hidden):
    n, k, e = hidden.shape[0], block.top_k, block.num_experts
    capacity_factor = e / (n * k)  # capacity 1: each expert serves one pair
    kept = kept_by_policy(block, hidden, 1)
    out, counts = moe_forward(hidden, block.gate, k, identity_slots(block), capacity_factor, LOCAL)
    fully_dropped = ~kept.any(dim=1)
    assert fully_dropped.sum() >= n - e and counts.slot_tokens.tolist() == [1] * e
    assert torch.count_nonzero(out[fully_dropped]) == 0
    assert torch.count_nonzero(out[~fully_dropped], dim=1).min() > 0


def test_capacity_factor_changes_live_between_steps(moe_models):
    engine = make_engine(moe_models, EngineConfig(spec_method="off"))
    prompts = code_prompts(moe_models.tokenizer, 3, max_bytes=60)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    generate(engine, prompts, params)
    dropless = engine.snapshot()
    engine.apply(EngineConfig(spec_method="off", capacity_factor=0.5, version=1))
    assert engine.snapshot().capacity_factor == 0.5
    generate(engine, prompts, params)
    tight = engine.snapshot()
    assert dropless.capacity_factor == 0.0 and dropless.dropped_tokens == 0
    assert tight.dropped_tokens > 0 and engine.config.capacity_factor == 0.5
    assert sum(tight.dropped_per_layer) == tight.dropped_tokens
    for routed, computed, dropped in zip(tight.expert_tokens, tight.slot_tokens, tight.dropped_per_layer):
        assert sum(routed) == sum(computed) + dropped


def test_capacity_factor_out_of_range_is_refused():
    with pytest.raises(ValueError, match="capacity_factor"):
        EngineConfig(capacity_factor=-1)
    with pytest.raises(ValueError, match="capacity_factor"):
        EngineConfig(capacity_factor=17)
