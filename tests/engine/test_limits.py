"""Overload and hostile input on a real loopback server: limits refuse before work, admission refuses past its
bounds with 429, and a client that leaves takes its request (and its KV blocks) with it."""
import asyncio
import json
import time

import httpx
import pytest

from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from engine.server.admission import Admission, AdmissionLimits, Overloaded
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from engine.server.serving_metrics import ServingLimitsCollector
from engine.telemetry.metrics import EngineMetrics
from seam import EngineConfig

MODEL = "governor-moe"
MAX_BODY = 4096
MAX_CHARS = 300


def _serve(moe_models, admission: Admission, max_num_seqs: int = 32):
    metrics = EngineMetrics(MODEL)
    engine = Engine(moe_models.target, moe_models.tokenizer, config=EngineConfig(spec_method="off", draft_len=0),
                    limits=EngineLimits(kv_cache_tokens=2048, max_num_seqs=max_num_seqs), sinks=[metrics])
    service = EngineService(engine, admission=admission)
    metrics.registry.register(ServingLimitsCollector(MODEL, admission, engine.allocator, {"max_body_bytes": MAX_BODY}))
    app = create_app(service, MODEL, "token", metrics=metrics, max_body_bytes=MAX_BODY, max_prompt_chars=MAX_CHARS)
    return serving_in_thread(app, service), engine


@pytest.fixture(scope="module")
def server(moe_models):
    serving, engine = _serve(moe_models, Admission())
    with serving as url:
        yield url, engine


def _metric(url: str, line_start: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])


def _assert_openai_error(reply: httpx.Response, status: int, param: str | None) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    return error


def _kv_idle(engine, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.allocator.num_free == engine.allocator.num_blocks and not engine.has_work:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "ab\ud800cd"}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": ["\udfff"]}, "stop.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
])
def test_a_lone_surrogate_gets_400_naming_the_field(server, path, body, param):
    escaped = json.dumps({"model": MODEL, **body})          # ASCII, with the surrogate as a \ud800 escape
    reply = httpx.post(f"{server[0]}{path}", content=escaped, headers={"content-type": "application/json"})
    assert _assert_openai_error(reply, 400, param)["message"].startswith(param)


def test_invalid_utf8_gets_400_in_the_openai_shape(server):
    reply = httpx.post(f"{server[0]}/v1/completions", content=b'{"model": "governor-moe", "prompt": "\xff\xfe"}',
                       headers={"content-type": "application/json"})
    _assert_openai_error(reply, 400, None)


def test_a_body_declared_over_the_limit_gets_413_unread(server):
    url = server[0]
    before = _metric(url, 'governor_requests_refused_total{model="governor-moe",reason="body_too_large"}')
    reply = httpx.post(f"{url}/v1/completions", content=b"x" * (MAX_BODY + 1),
                       headers={"content-type": "application/json"})
    _assert_openai_error(reply, 413, "body")
    assert _metric(url, 'governor_requests_refused_total{model="governor-moe",reason="body_too_large"}') == before + 1


def test_a_streamed_body_over_the_limit_gets_413(server):
    def chunks():
        for _ in range(MAX_BODY // 512 + 2):
            yield b" " * 512                         # no Content-Length: chunked transfer, counted as it arrives
    reply = httpx.post(f"{server[0]}/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    _assert_openai_error(reply, 413, "body")


def test_a_prompt_over_the_character_limit_gets_400_before_tokenizing(server):
    httpx.get(f"{server[0]}/admin/window?reader=test")          # opens this test's own window
    reply = httpx.post(f"{server[0]}/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "x" * 200}, {"role": "user", "content": "y" * 200}]})
    assert str(MAX_CHARS) in _assert_openai_error(reply, 400, "messages")["message"]
    reply = httpx.post(f"{server[0]}/v1/completions", json={"model": MODEL, "prompt": "x" * (MAX_CHARS + 1)})
    _assert_openai_error(reply, 400, "prompt")
    assert httpx.get(f"{server[0]}/admin/window?reader=test").json()["steps"] == 0


def test_the_schema_declares_the_bounds_it_enforces(server):
    schema = httpx.get(f"{server[0]}/openapi.json").json()
    completion = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert completion["prompt"]["anyOf"][0]["maxLength"] == MAX_CHARS
    assert completion["model"]["enum"] == [MODEL]
    put = schema["paths"]["/admin/config"]["put"]
    assert put["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/EngineConfig"}
    assert schema["components"]["schemas"]["EngineConfig"]["properties"]["draft_len"]["maximum"] == 16
    assert {"401", "413"} <= set(put["responses"]) and "422" not in put["responses"]


def test_a_non_streaming_client_that_leaves_frees_its_kv_blocks(server):
    url, engine = server
    tokens_before = _metric(url, 'governor_generation_tokens_total{model="governor-moe"}')
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", timeout=httpx.Timeout(0.5, connect=5),
                   json={"model": MODEL, "prompt": "def f(x):\n", "max_tokens": 480, "ignore_eos": True})
    assert _kv_idle(engine), "the abandoned request still holds KV blocks"
    generated = _metric(url, 'governor_generation_tokens_total{model="governor-moe"}') - tokens_before
    assert generated < 480                          # it was cut short, not run to max_tokens


def test_past_the_waiting_bound_a_request_gets_429_and_admitted_ones_finish(moe_models):
    """One sequence runs at a time, so a second request waits; with room for one waiting, a third is refused."""
    serving, engine = _serve(moe_models, Admission(AdmissionLimits(max_waiting_requests=1, retry_after_seconds=3)),
                             max_num_seqs=1)

    async def scenario(url: str):
        body = {"model": MODEL, "prompt": "import os\n", "max_tokens": 120, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            running = asyncio.create_task(client.post("/v1/completions", json=body))
            while _metric(url, 'governor_kv_blocks_in_use{model="governor-moe"}') == 0:
                await asyncio.sleep(0.02)
            waiting = asyncio.create_task(client.post("/v1/completions", json=body))
            while _metric(url, 'governor_waiting_requests{model="governor-moe"}') == 0:
                await asyncio.sleep(0.02)
            refused = await client.post("/v1/completions", json=body)
            return refused, await running, await waiting

    with serving as url:
        refused, first, second = asyncio.run(scenario(url))
        assert refused.headers["retry-after"] == "3"
        assert _assert_openai_error(refused, 429, None)["code"] == "requests_waiting"
        assert first.status_code == second.status_code == 200
        assert first.json()["usage"]["completion_tokens"] == second.json()["usage"]["completion_tokens"] == 120
        assert _metric(url, 'governor_requests_refused_total{model="governor-moe",reason="requests_waiting"}') == 1
        assert _metric(url, 'governor_limit{limit="max_waiting_requests",model="governor-moe"}') == 1
        assert _kv_idle(engine) and _metric(url, 'governor_waiting_requests{model="governor-moe"}') == 0


def test_the_prompt_token_bound_refuses_what_would_pass_it_and_started_requests_free_it():
    admission = Admission(AdmissionLimits(max_waiting_tokens=100))
    admission.admit("a", 60)
    with pytest.raises(Overloaded) as refused:
        admission.admit("b", 41)
    assert refused.value.reason == "tokens_waiting" and admission.refusals.counts["tokens_waiting"] == 1
    admission.started("a")
    admission.started("a")                          # idempotent: a finish after the first token frees nothing more
    admission.admit("b", 100)
    assert (admission.waiting_requests, admission.waiting_tokens) == (1, 100)


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_request_bound_follows_littles_law_once_the_engine_is_the_bottleneck():
    """20 requests leave the queue in 10 s while others wait: 2/s, so a 3 s wait holds 6; at light load (no one left
    behind) no rate is measured and the fixed bound stands."""
    clock = _Clock()
    admission = Admission(AdmissionLimits(max_waiting_requests=64, max_waiting_seconds=3.0), clock=clock)
    for i in range(30):
        admission.admit(f"light{i}", 1)
        admission.started(f"light{i}")                  # started at once: the queue was empty behind it
    assert admission.departure_rate() is None and admission.request_bound() == 64
    for i in range(21):
        admission.admit(f"r{i}", 1)
    for i in range(20):
        clock.now += 0.5
        admission.started(f"r{i}")
    assert admission.departure_rate() == pytest.approx(2.0) and admission.request_bound() == 6
    for i in range(5):
        admission.admit(f"more{i}", 1)                  # 1 + 5 waiting: the bound is reached
    with pytest.raises(Overloaded) as refused:
        admission.refuse_if_full()
    assert refused.value.reason == "requests_waiting" and "GOVERNOR_MAX_WAITING_SECONDS" in str(refused.value)
    clock.now += 11                                     # the departures age out of the window
    assert admission.departure_rate() is None and admission.request_bound() == 64


def test_a_fast_engine_keeps_the_fixed_bound():
    clock = _Clock()
    admission = Admission(AdmissionLimits(max_waiting_requests=4, max_waiting_seconds=5.0), clock=clock)
    for i in range(3):
        admission.admit(f"r{i}", 1)
    for i in range(40):
        admission.admit(f"x{i}", 1)
        clock.now += 0.1
        admission.started(f"x{i}")                      # the r* requests stay behind: every departure is busy
    assert admission.departure_rate() == pytest.approx(4.0)
    assert admission.request_bound() == 4               # 4/s x 5 s = 20 waiting would still meet the SLO


def test_a_refusal_for_a_full_queue_is_held_before_it_is_sent(moe_models):
    serving, _ = _serve(moe_models, Admission(AdmissionLimits(max_waiting_requests=1, refusal_delay_seconds=0.4)),
                        max_num_seqs=1)

    async def scenario(url: str):
        body = {"model": MODEL, "prompt": "import os\n", "max_tokens": 200, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            tasks = [asyncio.create_task(client.post("/v1/completions", json=body))]
            while _metric(url, 'governor_kv_blocks_in_use{model="governor-moe"}') == 0:
                await asyncio.sleep(0.02)
            tasks.append(asyncio.create_task(client.post("/v1/completions", json=body)))
            while _metric(url, 'governor_waiting_requests{model="governor-moe"}') == 0:
                await asyncio.sleep(0.02)
            sent = time.perf_counter()
            refused = await client.post("/v1/completions", json=body)
            held = time.perf_counter() - sent
            return refused, held, await asyncio.gather(*tasks)

    with serving as url:
        refused, held, admitted = asyncio.run(scenario(url))
        assert refused.status_code == 429 and held >= 0.4
        assert [r.status_code for r in admitted] == [200, 200]
