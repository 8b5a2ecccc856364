"""The seam over HTTP: one controller, two real engine replicas on loopback; windows merge, configs reach both."""
import time

import httpx

from controller.clients import HttpClient, InProcessClient
from controller.window_stats import merge_windows
from engine.server.service import EngineService
from seam import EngineConfig, Experiment
from tests.controller.server import TOKEN, serving
from tests.controller.traffic import ClosedLoopTraffic, HttpTraffic
from tests.engine.helpers import make_engine


def test_http_client_applies_to_every_replica_and_merges_their_windows(moe_models):
    services = [EngineService(make_engine(moe_models, EngineConfig(draft_len=2))) for _ in range(2)]
    with serving(services[0], None) as one, serving(services[1], None) as two, HttpTraffic(one, 2), \
            HttpTraffic(two, 2):
        client = HttpClient([one, two], TOKEN)
        client.snapshot()
        client.apply(EngineConfig(draft_len=5, version=7))
        time.sleep(1.0)
        window = client.snapshot()
        configs = [httpx.get(f"{url}/admin/config").json() for url in (one, two)]
    assert [c["draft_len"] for c in configs] == [5, 5]
    assert window.config_version == 7 and window.draft_len == 5
    assert window.emitted_tokens > 0 and len(window.drafted_per_position) == 5


def test_http_client_runs_an_experiment_on_every_replica_and_pairs_blocks_within_each(moe_models):
    services = [EngineService(make_engine(moe_models, EngineConfig(draft_len=2, version=1))) for _ in range(2)]
    experiment = Experiment(incumbent=EngineConfig(draft_len=2, version=1),
                            candidate=EngineConfig(spec_method="off", draft_len=0, version=2), block_steps=2)
    with serving(services[0], None) as one, serving(services[1], None) as two, HttpTraffic(one, 2), \
            HttpTraffic(two, 2):
        client = HttpClient([one, two], TOKEN)
        client.snapshot()
        client.apply(experiment)
        time.sleep(1.5)
        window = client.snapshot()
        client.apply(EngineConfig(draft_len=2, version=3))
        refused = httpx.put(f"{one}/admin/experiment", json={"incumbent": {}, "candidate": {"draft_len": -1}},
                            headers={"Authorization": f"Bearer {TOKEN}"})
    assert {b.source for b in window.blocks} == {one, two}
    assert {(b.arm, b.config_version) for b in window.blocks} == {("incumbent", 1), ("candidate", 2)}
    assert window.arms["candidate"].draft_len == 0 and window.arms["incumbent"].draft_len == 2
    # (steps between the snapshot and the experiment's first block belong to no arm)
    assert 0 < window.arms["candidate"].emitted_tokens + window.arms["incumbent"].emitted_tokens <= window.emitted_tokens
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "candidate.draft_len"


def test_merged_window_sums_counters_and_keeps_the_worst_latency(moe_models, prompts):
    windows = []
    for k in (2, 4):
        engine = make_engine(moe_models, EngineConfig(draft_len=k))
        with ClosedLoopTraffic(engine, prompts):
            time.sleep(0.8)
        windows.append(InProcessClient(engine).snapshot())
    merged = merge_windows(windows)
    assert merged.emitted_tokens == sum(w.emitted_tokens for w in windows)
    assert merged.drafted_per_position == [sum(w.drafted_per_position[j] for w in windows if j < w.draft_len)
                                           for j in range(4)]
    assert merged.inter_token_seconds.p99 == max(w.inter_token_seconds.p99 for w in windows)
    assert merged.inter_token_seconds.count == sum(w.inter_token_seconds.count for w in windows)
    assert merged.step_seconds == sum(w.step_seconds for w in windows)
