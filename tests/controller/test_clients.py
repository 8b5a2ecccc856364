"""The seam over HTTP: one controller, two real engine replicas on loopback; windows merge, configs reach both."""
import time

import httpx

from controller.clients import HttpClient, InProcessClient
from controller.window_stats import merge_windows
from engine.service import EngineService
from seam import EngineConfig
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
