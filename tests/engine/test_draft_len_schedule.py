"""k by batch size: the engine drafts, at every step, the k its schedule gives the batch it is about to run, and
greedy output stays equal to plain decoding; a drafter switch mid-stream stays lossless; a bad schedule is refused
with the field named, over HTTP too."""
import pytest
from pydantic import ValidationError

from engine.engine import Engine, RequestError
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, make_engine

PLAIN = EngineConfig(version=1, spec_method="off", draft_len=0)
SCHEDULE = ((1, 6), (2, 3), (4, 1), (64, 0))       # batch 1: k 6, 2: k 3, 3-4: k 1, above: 0
SHORT = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
LONGER = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(moe_models):
    return code_prompts(moe_models.tokenizer, 6, max_bytes=120)


def _run(engine, prompts, arrivals: dict[int, list[int]], switch_at: dict[int, EngineConfig] = {}, params=SHORT):
    """Step the engine to completion, adding prompts at the steps arrivals names and applying configs at the steps
    switch_at names; returns outputs per prompt and (batch size, largest k drafted) per step that drafted."""
    outputs: dict[str, list[int]] = {}
    drafted = []
    step = 0
    engine.snapshot("test")                     # the reader's windows start here
    while step == 0 or engine.has_work or any(s >= step for s in arrivals):
        for i in arrivals.get(step, []):
            engine.add_request(str(i), prompts[i], params)
        if step in switch_at:
            engine.apply(switch_at[step])
        batch = engine.scheduler.next_batch_size
        planned = engine.config.draft_len_for(batch) if step not in switch_at else None
        for emission in engine.step():
            outputs.setdefault(emission.request_id, []).extend(emission.token_ids)
        window = engine.snapshot("test")
        if planned is not None and window.steps:
            drafted.append((batch, len(window.drafted_per_position), planned))
        step += 1
    return [outputs.get(str(i), []) for i in range(len(prompts))], drafted


def test_each_step_drafts_the_k_of_its_batch_band_and_greedy_output_equals_plain(moe_models, prompts):
    arrivals = {0: [0], 2: [1], 3: [2, 3], 4: [4, 5]}     # the batch grows 1 -> 2 -> 4 -> 6, then shrinks
    plain, _ = _run(make_engine(moe_models, PLAIN), prompts, arrivals, params=LONGER)
    scheduled = EngineConfig(version=2, spec_method="draft_model", draft_len_schedule=SCHEDULE)
    outputs, steps = _run(make_engine(moe_models, scheduled), prompts, arrivals, params=LONGER)
    assert outputs == plain
    assert all(k_drafted <= planned for _, k_drafted, planned in steps)
    by_band = {planned for _, _, planned in steps}
    assert {6, 3, 1, 0} <= by_band, f"the batch never crossed every band: {steps}"
    assert any(k_drafted == 6 for batch, k_drafted, _ in steps if batch == 1)
    assert all(k_drafted == 0 for batch, k_drafted, _ in steps if batch > 4)


@pytest.mark.parametrize("switches", [
    {3: EngineConfig(version=2, spec_method="ngram", draft_len_schedule=SCHEDULE),
     7: EngineConfig(version=3, spec_method="draft_model", draft_len=5),
     11: EngineConfig(version=4, spec_method="off", draft_len=5),
     14: EngineConfig(version=5, spec_method="draft_model", draft_len_schedule=((2, 2), (8, 4)))},
], ids=["draft-ngram-draft-off-draft"])
def test_a_drafter_switch_mid_stream_stays_lossless(moe_models, prompts, switches):
    arrivals = {0: [0, 1, 2], 5: [3, 4, 5]}
    plain, _ = _run(make_engine(moe_models, PLAIN), prompts, arrivals)
    start = EngineConfig(version=1, spec_method="draft_model", draft_len=4)
    outputs, _ = _run(make_engine(moe_models, start), prompts, arrivals, switch_at=switches)
    assert outputs == plain


def test_a_single_draft_len_is_the_one_band_schedule():
    config = EngineConfig(spec_method="ngram", draft_len=5)
    assert config.draft_len_bands == ((1, 5),) and [config.draft_len_for(b) for b in (1, 7, 500)] == [5, 5, 5]
    banded = EngineConfig(draft_len_schedule=[[1, 8], [4, 4], [16, 2], [1024, 0]])
    assert [banded.draft_len_for(b) for b in (1, 2, 4, 5, 16, 17, 5000)] == [8, 4, 4, 2, 2, 0, 0]
    assert banded.longest_draft_len == 8 and banded.changed(spec_method="off").draft_len_for(1) == 0


@pytest.mark.parametrize(("schedule", "loc", "message"), [
    ([], (), "at least 1 item"),
    ([[4, 2], [4, 1]], (), "strictly increasing"),
    ([[8, 2], [4, 1]], (), "strictly increasing"),
    ([[0, 2]], (0, 0), "greater than or equal to 1"),
    ([[1, 2], [4, 17]], (1, 1), "less than or equal to 16"),
    ([[1, -1]], (0, 1), "greater than or equal to 0"),
    ([[1, 2, 3]], (0,), "at most 2 items"),
])
def test_a_bad_schedule_is_refused_naming_the_field(schedule, loc, message):
    with pytest.raises(ValidationError) as caught:
        EngineConfig(draft_len_schedule=schedule)
    first = caught.value.errors()[0]
    assert first["loc"] == ("draft_len_schedule", *loc) and message in first["msg"]


def test_a_schedule_that_drafts_with_a_draft_model_the_engine_lacks_is_refused(moe_models):
    """draft_len 0 with a schedule whose bands draft still drafts: the check reads what the step drafts (the
    largest k of any band), so such a config is refused up front instead of failing every step after it."""
    engine = Engine(moe_models.target, moe_models.tokenizer, None, EngineConfig(spec_method="ngram"))
    config = EngineConfig(version=1, spec_method="draft_model", draft_len=0, draft_len_schedule=((1, 4), (1024, 0)))
    with pytest.raises(RequestError) as refused:
        engine.apply(config)
    assert refused.value.field == "spec_method"
    assert engine.desired_config.spec_method == "ngram"
    engine.apply(config.changed(draft_len_schedule=((1, 0), (1024, 0))))       # drafts nothing: plain decoding
