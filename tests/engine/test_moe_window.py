"""The MoE figures of the Window, under the names the /metrics and controller engineers use."""
import pytest

from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from governor.loaders import load_models
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, generate

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
MOE_NAMES = ("expert_tokens", "slot_tokens", "rank_tokens", "dropped_tokens", "dropped_per_layer", "balancedness",
             "balancedness_per_layer", "all_to_all_seconds", "comm_share", "capacity_factor", "replacement_seconds")


def test_an_moe_window_carries_heat_drops_and_balance(moe_models):
    engine = Engine(moe_models.target, moe_models.tokenizer, None, EngineConfig(spec_method="off", capacity_factor=1),
                    EngineLimits(kv_cache_tokens=2048))
    generate(engine, code_prompts(moe_models.tokenizer, 4, max_bytes=60), PARAMS)
    window = engine.snapshot().to_dict()
    assert set(MOE_NAMES) <= window.keys()
    layers, experts = len(moe_models.target.moe_blocks), moe_models.target.spec.num_experts
    assert [len(row) for row in window["expert_tokens"]] == [experts] * layers
    assert [len(row) for row in window["slot_tokens"]] == [experts] * layers
    assert window["rank_tokens"] == [[sum(row)] for row in window["slot_tokens"]]
    assert window["dropped_tokens"] == sum(window["dropped_per_layer"]) > 0
    assert window["balancedness"] == 1.0 and window["balancedness_per_layer"] == [1.0] * layers
    assert window["comm_share"] == 0.0 and window["capacity_factor"] == 1.0


def test_a_dense_window_has_no_moe_figures():
    dense = load_models("governor-draft", draft="none")
    engine = Engine(dense.target, dense.tokenizer, None, EngineConfig(spec_method="off"), EngineLimits(1024))
    generate(engine, code_prompts(dense.tokenizer, 1, max_bytes=40), PARAMS)
    window = engine.snapshot()
    assert window.emitted_tokens == PARAMS.max_tokens
    assert window.expert_tokens is None and window.slot_tokens is None and window.rank_tokens is None
    assert window.balancedness is None and window.dropped_tokens == 0 and window.comm_share == 0.0


def test_placement_on_a_dense_target_is_refused():
    dense = load_models("governor-draft", draft="none")
    engine = Engine(dense.target, dense.tokenizer, None, EngineConfig(spec_method="off"), EngineLimits(1024))
    with pytest.raises(ValueError, match="placement: the target has no MoE layers"):
        engine.apply(EngineConfig(spec_method="off", placement=((0,),)))
