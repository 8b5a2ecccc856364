"""`governor bench overload --mode retry` against a real `governor serve` that runs 2 sequences and lets 2 wait: the
capacity arms are admitted whole, the overload arm's fast retries are refused without a 5xx, and the ratio is the
overload arm's admitted throughput over the capacity arms' mean."""
import pytest

BENCH = ["overload", "--mode", "retry", "--clients", "2", "--factor", "4", "--retry-ms", "20", "--seconds", "4",
         "--max-tokens", "16", "--health-every", "0.05"]
RESULT = "overload-retry"


@pytest.fixture(scope="module", autouse=True)
def small_queues():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GOVERNOR_MAX_WAITING_REQUESTS", "2")
        patch.setenv("GOVERNOR_MAX_NUM_SEQS", "2")
        patch.setenv("GOVERNOR_REFUSAL_DELAY_SECONDS", "0.2")
        yield


def test_the_arms_run_in_order_and_only_the_overload_arm_is_refused(data):
    arms = data["arms"]
    assert [a["arm"] for a in arms] == ["capacity", "overload", "capacity"]
    assert [a["clients"] for a in arms] == [2, 8, 2]
    assert all(a["server_errors_5xx"] == 0 and a["admitted_per_s"] > 0 for a in arms)
    assert set(arms[0]["statuses"]) == set(arms[2]["statuses"]) == {"200"}
    assert arms[1]["statuses"].get("429", 0) > 0


def test_the_ratio_is_the_overload_arm_over_the_capacity_arms(data):
    arms = data["arms"]
    capacity = (arms[0]["admitted_per_s"] + arms[2]["admitted_per_s"]) / 2
    assert data["admitted_throughput_ratio"] == pytest.approx(arms[1]["admitted_per_s"] / capacity)
    assert all(a["health_s"]["failed"] == 0 and a["health_s"]["n"] >= 1 for a in arms)


def test_the_server_s_own_ttft_counts_each_arm_s_first_tokens(data):
    """The server's histogram, differenced over each arm, counts that arm's first tokens, one per admitted request;
    the server times a part of what the client does, so the client's median is past every bound under which fewer
    than half the server's first tokens came."""
    for arm in data["arms"]:
        server = arm["server_ttft"]
        assert server["n"] == arm["statuses"]["200"], arm["arm"]
        shares = {float(bound): share for bound, share in server["share_within"].items()}
        assert list(shares.values()) == sorted(shares.values()) and max(shares.values()) <= 1.0
        below_half = [bound for bound, share in shares.items() if share < 0.5]
        assert arm["admitted_ttft_s"]["p50"] >= max(below_half, default=0.0)


def test_writes_a_plot(out):
    assert (out / "overload-retry.png").stat().st_size > 10_000
