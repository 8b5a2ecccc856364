"""The controller bench's goodput: tokens count in the phase that delivered them, from requests that met the SLO."""
from governor.bench.adaptation_workload import PhaseSpec, RequestRecord, RunResult, goodput

SPECS = [PhaseSpec("a", 1, 10.0, ()), PhaseSpec("b", 1, 10.0, ())]


def _record(sent: float, deliveries: list[tuple[float, int]], failed: bool = False) -> RequestRecord:
    return RequestRecord("a", "copy", sent, tokens=sum(n for _, n in deliveries), failed=failed, deliveries=deliveries)


def test_a_request_across_a_phase_boundary_counts_its_tokens_where_they_were_delivered():
    straddling = _record(8.0, [(8.5, 1), (9.5, 4), (10.5, 5)])        # still in flight at the end: judged as is
    result = RunResult(records=[straddling], phase_starts={"a": 0.0, "b": 10.0})
    assert goodput(result, SPECS, ttft_bound=5.0, gap_bound=0.5) == {"a": 0.5, "b": 0.5}


def test_requests_that_break_the_slo_or_fail_count_nothing():
    slow_first_token = _record(0.0, [(6.0, 1), (6.1, 9)])
    slow_gaps = _record(0.0, [(0.5, 1), (9.5, 2)])                     # 4.5 s a token
    failed = _record(0.0, [(0.5, 1), (0.6, 9)], failed=True)
    good = _record(0.0, [(0.5, 1), (0.6, 9)])
    result = RunResult(records=[slow_first_token, slow_gaps, failed, good], phase_starts={"a": 0.0, "b": 10.0})
    assert goodput(result, SPECS, ttft_bound=5.0, gap_bound=0.5) == {"a": 1.0, "b": 0.0}
