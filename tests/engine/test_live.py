"""LiveTelemetry: per-second buckets from telemetry events, bounded, read without touching the Window; and fed by a
real engine as one of its sinks."""
import time

import pytest
import torch

from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from engine.telemetry.live import HISTORY_SECONDS, SPAN_SECONDS, LiveTelemetry
from engine.telemetry.recorder import StepRecord
from seam import EngineConfig
from tests.engine.helpers import code_prompts, generate


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _step(live: LiveTelemetry, **overrides) -> None:
    step = {"batch_size": 2, "queue_depth": 1, "step_seconds": 0.1, "target_seconds": 0.08, "draft_seconds": 0.02,
            "drafted_per_position": [2, 2], "accepted_per_position": [2, 1], "num_drafts": 2, "prefill_tokens": 0,
            "expert_tokens": None, "rank_tokens": None, "all_to_all_seconds": 0.0}
    live.record_step(StepRecord(**{**step, **overrides}))


def test_seconds_are_bucketed_and_completed_seconds_reported():
    clock = Clock(1000.2)
    live = LiveTelemetry(clock)
    _step(live, batch_size=2, queue_depth=0)
    _step(live, batch_size=4, queue_depth=2, drafted_per_position=[2, 2, 2], accepted_per_position=[1, 0, 0])
    live.record_tokens(count=3, ttft=0.2, gap=None)
    live.record_tokens(count=3, ttft=None, gap=0.03)
    clock.now = 1002.5                                   # second 1001 passes with no events
    live.record_tokens(count=5, ttft=None, gap=0.05)     # the current second: not reported yet
    series = live.series(60)
    assert series["t"] == [1000, 1001]
    assert series["goodput"] == [6, 0]
    assert series["batch_size"] == [3.0, None] and series["queue_depth"] == [1.0, None]
    assert series["acceptance"][0] == pytest.approx(4 / 10)
    # acceptance and latency cover the trailing span, so the idle second still shows the one before it
    assert series["acceptance_per_position"] == [[pytest.approx(3 / 4)] * 2, [pytest.approx(1 / 4)] * 2, [0.0, 0.0]]
    assert series["ttft_p50"][0] == pytest.approx(0.2)
    assert series["inter_token_p99"][0] == pytest.approx(0.01)
    assert series["ttft_p50"][1] == pytest.approx(0.2)


def test_latency_span_ends_and_history_is_bounded():
    clock = Clock(0.0)
    live = LiveTelemetry(clock)
    live.record_finished(1.5)
    clock.now = SPAN_SECONDS + 1
    assert live.series()["e2e_p50"] == [1.5] * SPAN_SECONDS + [None]
    for second in range(HISTORY_SECONDS + 50):
        clock.now = 100 + second
        live.record_tokens(count=1, ttft=None, gap=None)
    assert len(live._seconds) == HISTORY_SECONDS
    assert len(live.series(10)["t"]) == 10


def test_experts_balancedness_and_communication_share():
    clock = Clock(10.0)
    live = LiveTelemetry(clock)
    experts = torch.tensor([[3, 1, 0, 0], [0, 0, 2, 2]])
    _step(live, expert_tokens=experts, rank_tokens=torch.tensor([[4, 0], [0, 4]]), step_seconds=0.2,
          all_to_all_seconds=0.05)
    _step(live, expert_tokens=experts, rank_tokens=torch.tensor([[2, 2], [2, 2]]), step_seconds=0.2,
          all_to_all_seconds=0.05)
    clock.now = 11.0
    series = live.series()
    assert series["expert_heat"] == [[0.75, 0.25, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]]
    assert series["balancedness"] == [pytest.approx((4 + 4) / (6 + 6))]    # summed ranks [[6, 2], [2, 6]]
    assert series["comm_share"] == [pytest.approx(0.25)]


def test_a_real_engine_feeds_it_and_reading_leaves_the_window_alone(moe_models):
    live = LiveTelemetry()
    engine = Engine(moe_models.target, moe_models.tokenizer, moe_models.draft, EngineConfig(draft_len=3),
                    EngineLimits(kv_cache_tokens=8192), sinks=[live])
    generate(engine, code_prompts(moe_models.tokenizer, 4))
    live._clock = lambda: time.time() + 1
    series = live.series()
    window = engine.snapshot()
    assert window.emitted_tokens > 0 and sum(series["goodput"]) == window.emitted_tokens
    assert len(series["acceptance_per_position"]) == 3
    assert len(series["expert_heat"]) == 4 and len(series["expert_heat"][0]) == 8
