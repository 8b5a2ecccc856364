"""EngineMetrics sees exactly the events the Window is built from, and keeps counting across snapshots."""
import pytest

from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from engine.telemetry.metrics import EngineMetrics
from engine.telemetry.recorder import StepRecord
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, generate

MODEL = "governor-moe"


def _value(metrics: EngineMetrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value(name, {"model": MODEL, **labels})
    return 0.0 if value is None else value


def _engine(models, metrics: EngineMetrics, config: EngineConfig) -> Engine:
    return Engine(models.target, models.tokenizer, models.draft, config, EngineLimits(kv_cache_tokens=8192),
                  sinks=[metrics])


@pytest.fixture(scope="module")
def run(moe_models):
    """Two batches of traffic with a snapshot after each: the counters hold the sum of both Windows."""
    metrics = EngineMetrics(MODEL)
    engine = _engine(moe_models, metrics, EngineConfig(draft_len=3))
    prompts = code_prompts(moe_models.tokenizer, 4, max_bytes=80)
    windows = []
    for batch in (prompts[:2], prompts[2:]):
        generate(engine, batch)
        windows.append(engine.snapshot())
    return metrics, windows


def test_counters_equal_the_sum_of_the_windows(run):
    metrics, windows = run
    totals = {
        "governor_spec_decode_num_drafts_total": "num_drafts",
        "governor_spec_decode_num_draft_tokens_total": "drafted_tokens",
        "governor_spec_decode_num_accepted_tokens_total": "accepted_tokens",
        "governor_generation_tokens_total": "emitted_tokens",
        "governor_prompt_tokens_total": "prefill_tokens",
        "governor_requests_finished_total": "finished_requests",
        "governor_step_duration_seconds_count": "steps",
    }
    for metric, field in totals.items():
        assert _value(metrics, metric) == sum(getattr(w, field) for w in windows), metric
    assert windows[0].accepted_tokens > 0
    for metric, field in (("governor_target_forward_seconds_total", "target_forward_seconds"),
                          ("governor_draft_forward_seconds_total", "draft_forward_seconds"),
                          ("governor_step_duration_seconds_sum", "step_seconds")):
        assert _value(metrics, metric) == pytest.approx(sum(getattr(w, field) for w in windows)), metric


def test_shadow_lookup_counters_equal_the_windows_of_plain_decoding(moe_models):
    metrics = EngineMetrics(MODEL)
    engine = _engine(moe_models, metrics, EngineConfig(spec_method="off", draft_len=0))
    generate(engine, code_prompts(moe_models.tokenizer, 2, max_bytes=80))
    window = engine.snapshot()
    assert window.shadow_lookups > 0 and sum(window.shadow_accepted_per_position) > 0
    assert _value(metrics, "governor_shadow_lookup_drafts_total") == window.shadow_lookups
    assert _value(metrics, "governor_shadow_lookup_draft_tokens_total") == sum(window.shadow_drafted_per_position)
    assert _value(metrics, "governor_shadow_lookup_accepted_tokens_total") == sum(window.shadow_accepted_per_position)


def test_per_position_counters_equal_the_windows(run):
    metrics, windows = run
    for position in range(3):
        accepted = sum(w.accepted_per_position[position] for w in windows)
        drafted = sum(w.drafted_per_position[position] for w in windows)
        assert _value(metrics, "governor_spec_decode_num_accepted_tokens_per_pos_total",
                      position=str(position)) == accepted
        assert _value(metrics, "governor_spec_decode_num_draft_tokens_per_pos_total",
                      position=str(position)) == drafted


def test_expert_tokens_per_layer_and_expert_equal_the_windows(run):
    metrics, windows = run
    layers, experts = len(windows[0].expert_tokens), len(windows[0].expert_tokens[0])
    for layer in range(layers):
        for expert in range(experts):
            expected = sum(w.expert_tokens[layer][expert] for w in windows)
            assert _value(metrics, "governor_expert_tokens_total", layer=str(layer), expert=str(expert)) == expected


def test_latency_histograms_count_every_observation_of_the_windows(run):
    metrics, windows = run
    for metric, field in (("governor_time_to_first_token_seconds", "ttft_seconds"),
                          ("governor_inter_token_latency_seconds", "inter_token_seconds"),
                          ("governor_e2e_request_latency_seconds", "e2e_seconds")):
        assert _value(metrics, f"{metric}_count") == sum(getattr(w, field).count for w in windows), metric
        assert _value(metrics, f"{metric}_bucket", le="+Inf") == _value(metrics, f"{metric}_count")
    assert _value(metrics, "governor_e2e_request_latency_seconds_sum") == pytest.approx(
        sum(w.e2e_seconds.mean * w.e2e_seconds.count for w in windows))


def test_config_info_follows_the_config_the_engine_adopts(moe_models):
    metrics = EngineMetrics(MODEL)
    engine = _engine(moe_models, metrics, EngineConfig(draft_len=3))
    labels = {"version": "0", "spec_method": "draft_model", "draft_len": "3", "ngram_min": "1", "ngram_max": "4",
              "capacity_factor": "0.0", "placement": "None", "draft_len_schedule": "None"}
    assert _value(metrics, "governor_config_info", **labels) == 1
    engine.apply(EngineConfig(version=7, spec_method="ngram", draft_len=2))
    assert _value(metrics, "governor_config_info", **labels) == 1, "a pending config is not live yet"
    generate(engine, code_prompts(moe_models.tokenizer, 1, max_bytes=40))
    assert _value(metrics, "governor_config_info", **labels) == 0
    assert _value(metrics, "governor_config_info", **{**labels, "version": "7", "spec_method": "ngram",
                                                     "draft_len": "2"}) == 1
    engine.apply(EngineConfig(version=8, draft_len_schedule=((1, 8), (4, 4), (1024, 0))))
    generate(engine, code_prompts(moe_models.tokenizer, 1, max_bytes=40))
    assert _value(metrics, "governor_config_info", **{**labels, "version": "8", "draft_len": "4",
                                                     "draft_len_schedule": "1:8,4:4,1024:0"}) == 1


def test_scraping_leaves_the_window_alone(moe_models):
    metrics = EngineMetrics(MODEL)
    engine = _engine(moe_models, metrics, EngineConfig(draft_len=3))
    generate(engine, code_prompts(moe_models.tokenizer, 1, max_bytes=40),
             SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    for _ in range(3):
        assert b"governor_generation_tokens_total" in metrics.exposition()
    window = engine.snapshot()
    assert window.emitted_tokens == 10 and window.finished_requests == 1


def test_batch_size_and_queue_depth_are_read_when_scraped():
    metrics = EngineMetrics(MODEL)
    load = {"running": 3, "waiting": 5}
    metrics.watch_load(lambda: load["running"], lambda: load["waiting"])
    assert (_value(metrics, "governor_batch_size"), _value(metrics, "governor_queue_depth")) == (3, 5)
    load.update(running=0, waiting=0)
    assert (_value(metrics, "governor_batch_size"), _value(metrics, "governor_queue_depth")) == (0, 0)


def test_moe_quantities_are_counted_when_given_and_absent_otherwise():
    metrics = EngineMetrics(MODEL)
    step = dict(batch_size=2, queue_depth=0, step_seconds=0.5, target_seconds=0.3, draft_seconds=0.1,
                drafted_per_position=[], accepted_per_position=[], num_drafts=0, prefill_tokens=0)
    metrics.record_step(StepRecord(**step))
    assert "\ngovernor_moe_slot_tokens_total{" not in metrics.exposition().decode()
    assert metrics.registry.get_sample_value("governor_moe_balancedness_ratio", {"model": MODEL}) is None
    metrics.record_step(StepRecord(**step, slot_tokens=[[4, 0, 2]], dropped_per_layer=[3], rank_tokens=[[4, 2]],
                                   balancedness=0.75, balancedness_per_layer=[0.75], all_to_all_seconds=0.2))
    metrics.record_step(StepRecord(**step, slot_tokens=[[1, 1, 1]], dropped_per_layer=[1], rank_tokens=[[2, 1]],
                                   balancedness=0.6, balancedness_per_layer=[0.6], all_to_all_seconds=0.1))
    assert _value(metrics, "governor_moe_slot_tokens_total", layer="0", slot="0") == 5
    assert _value(metrics, "governor_moe_slot_tokens_total", layer="0", slot="1") == 1
    assert _value(metrics, "governor_moe_dropped_tokens_total", layer="0") == 4
    assert _value(metrics, "governor_moe_rank_tokens_total", layer="0", rank="1") == 3
    assert _value(metrics, "governor_moe_all_to_all_seconds_total") == pytest.approx(0.3)
    assert _value(metrics, "governor_moe_balancedness_ratio") == 0.6
    assert _value(metrics, "governor_moe_layer_balancedness_ratio", layer="0") == 0.6
    assert _value(metrics, "governor_step_duration_seconds_count") == 3
