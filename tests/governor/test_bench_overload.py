"""`governor bench overload` against a real `governor serve` that runs 2 sequences and lets 4 wait: the burst of 40
is split between 200s and 429s however slowly a loaded machine sends it, and /health is probed throughout from a
process of the bench's own."""
import pytest

BENCH = ["overload", "--mode", "burst", "--requests", "40", "--max-tokens", "32", "--health-every", "0.05"]
RESULT = "overload"


@pytest.fixture(scope="module", autouse=True)
def small_queues():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GOVERNOR_MAX_WAITING_REQUESTS", "4")
        patch.setenv("GOVERNOR_MAX_NUM_SEQS", "2")
        yield


def test_the_burst_is_admitted_or_refused_and_nothing_fails(data):
    statuses = data["statuses"]
    assert set(statuses) == {"200", "429"} and sum(statuses.values()) == 40
    assert data["server_errors_5xx"] == 0 and data["transport_errors"] == []
    assert data["settings"]["limits"] == {"max_waiting_requests": 4, "max_waiting_tokens": 32768, "max_num_seqs": 2}
    assert data["kv_blocks_in_use_after"] == 0


def test_health_is_probed_throughout_and_every_probe_answers(data):
    health = data["health_s"]
    assert health["failed"] == 0 and health["n"] == len(health["timeline"]) >= 2
    times = [t for t, _ in health["timeline"]]
    assert times == sorted(times) and max(latency for _, latency in health["timeline"]) == pytest.approx(
        health["max"], abs=1e-4)


def test_writes_a_plot(out):
    assert (out / "overload.png").stat().st_size > 10_000
