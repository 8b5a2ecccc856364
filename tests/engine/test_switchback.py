"""Switchback experiments: the engine alternates two configs in blocks of steps; greedy output stays equal to plain
decoding whatever blocks a request crossed (speculation and the draft model's KV cache going off and back on), and
every block and arm is measured on its own."""
import pytest

from engine.engine import RequestError
from seam import EngineConfig, Experiment, SamplingParams
from tests.engine.helpers import code_prompts, generate, make_engine

PLAIN = EngineConfig(version=1, spec_method="off", draft_len=0)
DRAFT = EngineConfig(version=2, spec_method="draft_model", draft_len=4)
NGRAM = EngineConfig(version=3, spec_method="ngram", draft_len=3)
SHORT = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(moe_models):
    return code_prompts(moe_models.tokenizer, 6, max_bytes=120)


@pytest.fixture(scope="module")
def plain_outputs(moe_models, prompts):
    return generate(make_engine(moe_models, PLAIN), prompts, SHORT)


@pytest.mark.parametrize(("incumbent", "candidate", "block_steps"),
                         [(DRAFT, PLAIN, 1), (PLAIN, DRAFT, 2), (DRAFT, NGRAM, 3)],
                         ids=["draft-off-on-every-step", "plain-draft-2", "draft-ngram-3"])
def test_greedy_output_equals_plain_across_block_switches(moe_models, prompts, plain_outputs, incumbent, candidate,
                                                          block_steps):
    engine = make_engine(moe_models, DRAFT)
    engine.apply(Experiment(incumbent=incumbent, candidate=candidate, block_steps=block_steps))
    assert generate(engine, prompts, SHORT) == plain_outputs
    window = engine.snapshot()
    assert {b.arm for b in window.blocks} == {"incumbent", "candidate"}
    assert window.drafted_tokens > 0


def test_blocks_alternate_abba_and_each_arm_has_its_own_window(moe_models, prompts):
    engine = make_engine(moe_models, PLAIN)
    engine.apply(Experiment(incumbent=PLAIN, candidate=DRAFT, block_steps=1))
    generate(engine, prompts, SHORT)
    window = engine.snapshot()
    arms = [b.arm for b in window.blocks]
    assert len(arms) >= 4 and arms == [("incumbent", "candidate", "candidate", "incumbent")[i % 4]
                                       for i in range(len(arms))]
    assert [b.index for b in window.blocks] == list(range(len(window.blocks)))
    assert all(b.steps == 1 and b.emitted_tokens > 0 and b.busy_seconds > 0 for b in window.blocks)
    decoding = [b for b in window.blocks if b.decode_steps]
    assert decoding and all(b.decode_batch_size in range(1, len(prompts) + 1) for b in decoding)
    assert all(b.decode_batch_size is None and b.decode_tokens == 0 for b in window.blocks if not b.decode_steps)
    assert {b.config_version for b in window.blocks if b.arm == "candidate"} == {DRAFT.version}
    plain, draft = window.arms["incumbent"], window.arms["candidate"]
    assert plain.draft_len == 0 and plain.drafted_tokens == 0 and draft.draft_len == 4 and draft.drafted_tokens > 0
    assert plain.steps + draft.steps == window.steps
    assert plain.emitted_tokens + draft.emitted_tokens == window.emitted_tokens


def test_each_reader_gets_every_block_and_arm_in_its_own_window(moe_models, prompts):
    engine = make_engine(moe_models, PLAIN)
    engine.apply(Experiment(incumbent=PLAIN, candidate=DRAFT, block_steps=1))
    generate(engine, prompts[:3], SHORT)
    first = engine.snapshot("controller")
    generate(engine, prompts[3:], SHORT)
    later, whole = engine.snapshot("controller"), engine.snapshot()
    assert first.blocks and later.blocks and whole.blocks == first.blocks + later.blocks
    for arm in ("incumbent", "candidate"):
        assert whole.arms[arm].steps == first.arms[arm].steps + later.arms[arm].steps > 0
    assert engine.snapshot("controller").blocks == [] and engine.snapshot().blocks == []


def test_a_config_ends_the_experiment(moe_models, prompts):
    engine = make_engine(moe_models, PLAIN)
    engine.apply(Experiment(incumbent=PLAIN, candidate=DRAFT, block_steps=2))
    generate(engine, prompts[:3], SHORT)
    engine.apply(DRAFT)
    engine.snapshot()
    generate(engine, prompts[:3], SHORT)
    window = engine.snapshot()
    assert window.blocks is None and window.arms is None and engine.config == DRAFT and window.drafted_tokens > 0


def test_an_experiment_the_engine_cannot_run_is_refused(moe_models):
    engine = make_engine(moe_models, PLAIN)
    engine.model_drafter = None
    with pytest.raises(RequestError, match="spec_method"):
        engine.apply(Experiment(incumbent=PLAIN, candidate=DRAFT))


def test_the_config_reported_is_the_one_applied_last_before_any_step_takes_it(moe_models):
    # A rollback (apply) and a new trial's Experiment right after it, with no step between: the version the engine
    # reports must be one the controller intends (the Experiment's first arm), not the config its last step ran.
    engine = make_engine(moe_models, NGRAM)
    engine.apply(DRAFT)
    assert engine.desired_config == DRAFT
    engine.apply(Experiment(incumbent=DRAFT, candidate=PLAIN, block_steps=1))
    assert engine.desired_config == DRAFT
    engine.add_request("r", code_prompts(moe_models.tokenizer, 1)[0], SHORT)
    engine.step()
    assert engine.config == DRAFT and engine.desired_config == DRAFT      # ABBA: the incumbent's block first
    engine.step()
    assert engine.desired_config == PLAIN                                  # the arm in use
