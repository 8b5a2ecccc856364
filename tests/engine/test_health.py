"""/health and /ready tell the truth on a real loopback server: 503 with the reason when the engine thread is gone,
stalled while requests wait, or failing every step, and when the store cannot be written; requests are then refused
loudly, by cause."""
import sqlite3
import threading
import time

import httpx

from controller.store import WRITE_CHECK_SECONDS, Store
from engine.server.api import create_app
from engine.server.health import Health
from engine.server.local_server import serving_in_thread
from engine.server.service import FAILING_STEPS, EngineService
from engine.telemetry.metrics import EngineMetrics
from seam import EngineConfig
from tests.engine.helpers import make_engine, metric_value

COMPLETION = {"model": "governor-moe", "prompt": "def f(x):\n", "max_tokens": 4}


def _serve(service: EngineService, health: Health | None = None):
    metrics = EngineMetrics("governor-moe")
    return serving_in_thread(create_app(service, "governor-moe", "t", metrics=metrics, health=health), service)


def test_a_dead_engine_thread_is_503_on_health_and_ready_and_refuses_requests(moe_models):
    service = EngineService(make_engine(moe_models, EngineConfig(spec_method="off")))
    with _serve(service) as url:
        assert httpx.get(f"{url}/health").status_code == httpx.get(f"{url}/ready").status_code == 200
        assert metric_value(httpx.get(f"{url}/metrics").text, "governor_up", component="engine") == 1.0
        service.stop()
        for probe in ("/health", "/ready"):
            reply = httpx.get(f"{url}{probe}")
            assert reply.status_code == 503 and "engine thread" in reply.json()["reasons"]["engine"]
        refused = httpx.post(f"{url}/v1/completions", json=COMPLETION)
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "server_error"
        assert refused.json()["error"]["code"] == "engine_unavailable"
        metrics = httpx.get(f"{url}/metrics").text
        assert metric_value(metrics, "governor_up", component="engine") == 0.0
        assert metric_value(metrics, "governor_request_errors_total", cause="engine_unavailable") == 1.0


def _until_503(url: str, timeout: float = 10) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while (reply := httpx.get(f"{url}/health", timeout=30)).status_code != 503:
        assert time.monotonic() < deadline, reply.json()
        time.sleep(0.1)
    return reply


def test_an_engine_that_takes_no_step_while_work_waits_is_reported_stalled(moe_models):
    engine = make_engine(moe_models, EngineConfig(spec_method="off"))
    service = EngineService(engine, stall_seconds=0.5)
    with _serve(service) as url:
        with engine._config_lock:                 # the engine thread blocks at the start of its next step
            waiting = threading.Thread(target=httpx.post, args=(f"{url}/v1/completions",),
                                       kwargs={"json": COMPLETION, "timeout": 60})
            waiting.start()
            assert "no engine step" in _until_503(url).json()["reasons"]["engine"]
        waiting.join(timeout=60)
        assert httpx.get(f"{url}/health").status_code == 200


def test_an_engine_whose_steps_keep_failing_is_unhealthy_until_one_succeeds(moe_models, monkeypatch):
    engine = make_engine(moe_models, EngineConfig(spec_method="off"))
    working = engine.step

    def broken():
        raise RuntimeError("'NoneType' object has no attribute 'propose'")
    monkeypatch.setattr(engine, "step", broken)
    with _serve(EngineService(engine)) as url:
        for attempt in range(FAILING_STEPS):
            assert httpx.get(f"{url}/health").status_code == 200, f"only {attempt} steps failed so far"
            assert httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=30).status_code == 500
        reply = httpx.get(f"{url}/health")
        assert reply.status_code == 503
        assert f"the last {FAILING_STEPS} engine steps failed" in reply.json()["reasons"]["engine"]
        assert "'NoneType' object has no attribute 'propose'" in reply.json()["reasons"]["engine"]
        monkeypatch.setattr(engine, "step", working)                 # the cause is gone (a new config, say)
        assert httpx.post(f"{url}/v1/completions", json=COMPLETION, timeout=30).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200


def test_a_store_that_cannot_be_written_is_503(moe_models, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    service = EngineService(make_engine(moe_models, EngineConfig(spec_method="off")))
    with _serve(service, Health({"store": store.fault})) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        other_writer = sqlite3.connect(tmp_path / "g.db", isolation_level=None)
        other_writer.execute("BEGIN EXCLUSIVE")   # another process holds the write lock
        try:
            time.sleep(WRITE_CHECK_SECONDS)          # the last check's answer is kept this long
            reply = _until_503(url)
        finally:
            other_writer.execute("ROLLBACK")
            other_writer.close()
        assert reply.status_code == 503 and "cannot be written" in reply.json()["reasons"]["store"]
