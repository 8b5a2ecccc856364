"""Placement on one process: replicas, live re-placement, refusal of placements that cannot be served."""
import re

import httpx
import pytest

from engine.engine import Engine, RequestError
from engine.moe.experts import expert_topology
from engine.runtime.limits import EngineLimits
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, generate
from tests.engine.test_api import TOKEN, server  # noqa: F401  (the loopback server fixture)

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
LIMITS = EngineLimits(kv_cache_tokens=4096)
# 8 experts on one device with 3 redundant slots: 11 slots
REPLICATED = [[3, 3, 0, 1, 2, 4, 5, 6, 7, 7, 7], [7, 6, 5, 4, 3, 2, 1, 0, 0, 1, 2],
              [0, 1, 2, 3, 4, 5, 6, 7, 5, 5, 5], [1, 0, 3, 2, 5, 4, 7, 6, 6, 4, 2]]


def engine_with_spares(moe_models, config: EngineConfig) -> Engine:
    topology = expert_topology(moe_models.target.spec.num_experts, ranks=1, redundant_experts=3)
    return Engine(moe_models.target, moe_models.tokenizer, moe_models.draft, config, LIMITS, topology=topology)


def run_with_change(engine: Engine, prompts, change: EngineConfig, after_steps: int) -> tuple[list[list[int]], int]:
    """Generate, applying change after a few steps; returns outputs and how many requests were in flight then."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, PARAMS)
    outputs: dict[str, list[int]] = {}
    in_flight, steps = 0, 0
    while engine.has_work:
        if steps == after_steps:
            in_flight = len(engine.scheduler.running) + len(engine.scheduler.waiting)
            engine.apply(change)
        for emission in engine.step():
            outputs.setdefault(emission.request_id, []).extend(emission.token_ids)
            assert emission.finish_reason in (None, "length")
        steps += 1
    return [outputs[str(i)] for i in range(len(prompts))], in_flight


@pytest.fixture(scope="module")
def prompts(moe_models):
    return code_prompts(moe_models.tokenizer, 3, max_bytes=80)


@pytest.fixture(scope="module")
def reference(moe_models, prompts):
    return generate(engine_with_spares(moe_models, EngineConfig(spec_method="ngram")), prompts, PARAMS)


def test_live_replacement_with_replicas_keeps_outputs_and_requests(moe_models, prompts, reference):
    engine = engine_with_spares(moe_models, EngineConfig(spec_method="ngram"))
    outputs, in_flight = run_with_change(engine, prompts, EngineConfig(spec_method="ngram", placement=REPLICATED,
                                                                       version=1), after_steps=2)
    assert in_flight == len(prompts)
    assert outputs == reference and all(len(o) == PARAMS.max_tokens for o in outputs)
    window = engine.snapshot()
    assert window.replacement_seconds > 0
    assert engine.experts.placement == REPLICATED


def test_switching_placement_back_and_forth_rewrites_the_same_weights_and_keeps_no_graph(moe_models, prompts,
                                                                                         reference):
    """A switchback trial switches placement every few steps for minutes: each switch must reuse the slots' memory
    (a fresh set per switch grew the worker's RSS by gigabytes an hour) and record no autograd history."""
    engine = engine_with_spares(moe_models, EngineConfig(spec_method="ngram"))
    before = [(s.w1.data_ptr(), s.w3.data_ptr(), s.w2.data_ptr()) for s in engine.experts._slots]
    identity = engine.experts.placement
    for placement in (REPLICATED, identity, REPLICATED, identity):
        engine.experts.replace(placement)
    slots = engine.experts._slots
    assert [(s.w1.data_ptr(), s.w3.data_ptr(), s.w2.data_ptr()) for s in slots] == before
    assert not any(w.requires_grad or w.grad_fn is not None for s in slots for w in (s.w1, s.w3, s.w2))
    assert generate(engine, prompts, PARAMS) == reference


def test_pairs_of_a_replicated_expert_are_split_over_its_replicas(moe_models, prompts):
    engine = engine_with_spares(moe_models, EngineConfig(spec_method="off", placement=REPLICATED))
    generate(engine, prompts, SamplingParams(max_tokens=1, temperature=0.0))  # one forward: the prefill
    window = engine.snapshot()
    assert window.steps == 1
    for layer, phy2log in enumerate(REPLICATED):
        for expert in range(moe_models.target.spec.num_experts):
            served = [window.slot_tokens[layer][s] for s, e in enumerate(phy2log) if e == expert]
            assert sum(served) == window.expert_tokens[layer][expert]
            assert max(served) - min(served) <= 1  # alternating by queue position
    assert window.rank_tokens == [[sum(row)] for row in window.slot_tokens]
    assert window.balancedness == 1.0 and window.all_to_all_seconds == 0.0 and window.comm_share == 0.0


@pytest.mark.parametrize("placement, problem", [
    ([[0, 1, 2, 3, 4, 5, 6, 9, 0, 0, 0]] * 4, "unknown experts [9]"),
    ([[0, 1, 2, 3, 4, 5, 6, 7]] * 4, "8 slots; the topology has 11"),
    ([[0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 6]] * 4, "logical experts [7] have no replica"),
    ([[0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0]] * 3, "placement has 3 layers"),
])
def test_an_invalid_placement_is_refused_and_changes_nothing(moe_models, placement, problem):
    engine = engine_with_spares(moe_models, EngineConfig(spec_method="off"))
    before, placed = engine.config, engine.experts.placement
    with pytest.raises(RequestError, match=re.escape(problem)) as refused:
        engine.apply(EngineConfig(spec_method="off", placement=placement, version=1))
    assert refused.value.field == "placement"
    engine.step()
    assert engine.config == before and engine.experts.placement == placed


def test_admin_config_refuses_a_bad_placement_with_400_naming_the_field(server):  # noqa: F811
    url = f"{server[0]}/admin/config"
    before = httpx.get(url).json()
    bad = {**before, "version": before["version"] + 1, "placement": [[0, 1, 2, 3, 4, 5, 6, 6]] * 4}
    reply = httpx.put(url, json=bad, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "placement"
    assert "no replica" in reply.json()["error"]["message"]
    assert httpx.get(url).json() == before
