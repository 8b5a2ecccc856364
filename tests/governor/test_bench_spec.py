import math

import pytest

BENCH = ["spec", "--quick", "--models", "governor-moe"]
RESULT = "spec"
K_MAX = 8


def _numbers(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_writes_a_plot(out):
    assert (out / "spec.png").stat().st_size > 10_000


def test_records_the_machine_and_the_command(data):
    assert {"date", "cpu", "torch", "torch_threads"} <= data["machine"].keys()
    assert data["command"].startswith("governor bench spec") and "--quick" in data["command"]


def test_every_number_is_finite(data):
    assert all(math.isfinite(number) for number in _numbers(data))


def test_sweeps_k_from_zero_to_k_max_with_the_draft_model(data):
    [model] = data["models"]
    [drafter] = model["drafters"]
    assert (model["model"], drafter["method"]) == ("governor-moe", "draft_model")
    assert [point["k"] for point in drafter["sweep"]] == list(range(K_MAX + 1))
    for point in drafter["sweep"][1:]:
        assert point["tokens_per_second"] > 0 and point["cost_ratio"] > 0
        assert 0 <= point["acceptance_rate"] <= 1 and len(point["acceptance_per_position"]) == point["k"]
        assert point["predicted_speedup"] > 0 and point["target_cost_growth"] > 0


def test_speculation_is_lossless_and_the_figures_follow_from_the_sweep(data):
    """Greedy: every k decodes exactly plain decoding's tokens. Speedups are each k's throughput over k 0's, the
    best k is the fastest, and the prediction is Leviathan et al.'s formula at the measured alpha and cost."""
    [model] = data["models"]
    [drafter] = model["drafters"]
    plain, *drafting = drafter["sweep"]
    assert all(point["matches_plain_output"] == 1.0 for point in drafter["sweep"])
    assert all(point["emitted_tokens"] == plain["emitted_tokens"] for point in drafting)
    for point in drafting:
        k, alpha, cost = point["k"], point["alpha"], point["cost_ratio"]
        assert point["speedup"] == pytest.approx(point["tokens_per_second"] / plain["tokens_per_second"])
        assert point["predicted_speedup"] == pytest.approx((1 - alpha ** (k + 1)) / ((1 - alpha) * (k * cost + 1)))
        assert point["speedup_over_predicted"] == pytest.approx(point["speedup"] / point["predicted_speedup"])
    assert drafter["best_k"] == max(drafting, key=lambda point: point["tokens_per_second"])["k"]


def test_reports_peers_and_concurrency(data):
    [model] = data["models"]
    [drafter] = model["drafters"]
    assert model["hf_generate_tokens_per_second"] > 0 and model["hf_one_by_one_tokens_per_second"] > 0
    assert drafter["peer"]["tokens_per_second"] > 0 and drafter["concurrent_tokens_per_second"] > 0
    assert 1 <= drafter["best_k"] <= K_MAX


def test_judges_each_target(data):
    assert len(data["targets"]) == 3
    assert all(isinstance(target["met"], bool) and target["value"] is not None for target in data["targets"])
