"""What the page's event stream carries, read from a real controller and store (no browser): the speculation
indicator (on / off / fallback), history, decisions, the static assets, and the page without a controller."""
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from controller import Controller, InProcessClient, Store
from controller.operate.actions import Operator
from dashboards.operator_page import create_dashboard_router, dashboard_state
from engine.server.local_server import free_port
from engine.telemetry.live import LiveTelemetry
from policies import parse_policy
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.engine.helpers import make_engine


@pytest.fixture
def controller(moe_models, tmp_path):
    engine = make_engine(moe_models, EngineConfig(draft_len=3))
    return Controller(InProcessClient(engine), Store(f"sqlite:///{tmp_path / 'g.db'}"),
                      parse_policy(fast_policy(), "test"))


def _state(controller: Controller) -> dict:
    return dashboard_state(LiveTelemetry(), lambda: controller.client.config(), controller)


def test_speculation_is_on_then_off_by_an_operator_pin(controller):
    assert _state(controller)["speculation"] == "on"
    Operator(controller).pin(controller.current.model_copy(update={"spec_method": "off"}), "operator", "plain decoding")
    state = _state(controller)
    assert state["speculation"] == "off"
    assert state["decisions"][0]["action"] == "pin"
    assert state["history"][0]["diff"] == {"spec_method": ["draft_model", "off"]}
    assert state["controller"]["pin"]["owner"] == "operator"


def test_speculation_turned_off_by_an_alert_is_fallback(controller):
    Operator(controller).disable_speculation("alert:abc123", "SpecDecodeAcceptanceLow firing")
    assert _state(controller)["speculation"] == "fallback"


def test_a_kept_fallback_probe_is_fallback(controller):
    off = controller.store.record_config(controller.current.model_copy(update={"spec_method": "off"}), "controller",
                                         "probe plain decoding")
    controller.current = off
    controller.store.record_decision("fallback", "speculation does not pay", {}, config_version=off.version)
    assert _state(controller)["speculation"] == "fallback"


def test_without_a_controller_the_page_shows_the_engines_config(moe_models):
    engine = make_engine(moe_models, EngineConfig(spec_method="off", draft_len=0))
    state = dashboard_state(LiveTelemetry(), lambda: engine.config, None)
    assert state["speculation"] == "off" and state["config"]["draft_len"] == 0
    assert state["decisions"] == [] and state["controller"] is None


def test_assets_are_served_and_unknown_ones_are_404(moe_models):
    engine = make_engine(moe_models, EngineConfig(draft_len=2))
    app = FastAPI()
    app.include_router(create_dashboard_router(LiveTelemetry(), lambda: engine.config))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        plotly = httpx.get(f"{base}/dashboard/assets/plotly.min.js")
        assert plotly.status_code == 200 and "plotly.js" in plotly.text[:2000]
        assert httpx.get(f"{base}/dashboard/assets/app.css").status_code == 200
        assert httpx.get(f"{base}/dashboard/assets/secrets.txt").status_code == 404
        assert httpx.get(f"{base}/dashboard/assets/..%2Fweb.py").status_code == 404
        assert '<script type="module" src="/dashboard/assets/app.js">' in httpx.get(base).text
        assert httpx.get(f"{base}/dashboard/state").json()["live"]["t"] == []
    finally:
        server.should_exit = True
        thread.join(timeout=10)
