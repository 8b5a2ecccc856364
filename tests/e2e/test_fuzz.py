"""Schemathesis against the served app (engine, controller, dashboard) on a live loopback uvicorn: no 5xx, responses
as the OpenAPI document says, no warning that the schema is looser than the validation, and fuzzed writes without
the admin token always 401 and change nothing."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.clients import InProcessClient
from controller.plane import build_control_plane
from controller.store import ConfigVersion, Decision
from dashboards.operator_page import create_dashboard_router
from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from engine.telemetry.live import LiveTelemetry
from engine.telemetry.metrics import EngineMetrics
from seam import EngineConfig
from tests.controller.conftest import fast_policy

TOKEN = "fuzz-token"
ST = str(Path(sys.executable).with_name("st"))
EXAMPLES = "8"          # cases per operation and phase: the whole file stays well under a minute on 2 cores
WARNINGS = """[warnings]
display = ["validation_mismatch", "missing_test_data", "low_valid_rate", "missing_deserializer", "unresolvable_reference"]
fail-on = true
"""


@pytest.fixture
def served(moe_models, tmp_path):
    live, metrics = LiveTelemetry(), EngineMetrics("governor-moe")
    engine = Engine(moe_models.target, moe_models.tokenizer, moe_models.draft, EngineConfig(draft_len=2),
                    EngineLimits(kv_cache_tokens=1024), sinks=[metrics, live])
    service = EngineService(engine)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(fast_policy(window={"max_stretch": 1})))   # one idle tick closes a window
    plane = build_control_plane(InProcessClient(engine), str(policy), f"sqlite:///{tmp_path / 'g.db'}", TOKEN)
    app = create_app(service, "governor-moe", TOKEN, metrics=metrics, admin_router=plane.router)
    app.include_router(create_dashboard_router(live, lambda: engine.config, plane.controller))
    with serving_in_thread(app, service) as url:
        plane.controller.tick()                     # a closed window, so GET /admin/window has one to show
        yield url, plane.controller, engine, tmp_path


def _schemathesis(url: str, folder: Path, *options: str) -> subprocess.CompletedProcess:
    config = folder / "schemathesis.toml"
    config.write_text(WARNINGS)
    return subprocess.run([ST, "--config-file", str(config), "--no-color", "run", f"{url}/openapi.json",
                           "--max-examples", EXAMPLES, "--seed", "7", "--workers", "1", *options],
                          capture_output=True, text=True, timeout=300, cwd=folder)


def test_fuzzing_finds_no_5xx_and_no_schema_mismatch(served):
    url, _, _, folder = served
    # positive_data_acceptance is left out: a prompt's length in tokens plus max_tokens must fit the model's
    # context, a bound no JSON schema can state, so some schema-valid requests are rightly refused with 400
    run = _schemathesis(url, folder, "-H", f"Authorization: Bearer {TOKEN}", "--checks", "all",
                        "--exclude-checks", "positive_data_acceptance")
    assert run.returncode == 0, run.stdout[-6000:]
    assert "Warnings:" not in run.stdout, run.stdout[-3000:]


def test_fuzzed_writes_without_the_token_get_401_and_change_nothing(served):
    url, controller, engine, folder = served
    store = controller.store
    before = (store.count(Decision), store.count(ConfigVersion), controller.state(), engine.config)
    har = folder / "writes.har"
    run = _schemathesis(url, folder, "--include-method", "POST", "--include-method", "PUT", "--exclude-path-regex",
                        "^/v1/", "--phases", "fuzzing", "--checks", "not_a_server_error", "--report", "har", "--report-har-path", str(har))
    statuses = [entry["response"]["status"] for entry in json.loads(har.read_text())["log"]["entries"]
                if entry["request"]["method"] in ("POST", "PUT")]     # not the probes of undeclared methods
    assert len(statuses) > 20, run.stdout[-3000:]
    assert set(statuses) == {401}, run.stdout[-3000:]
    assert (store.count(Decision), store.count(ConfigVersion), controller.state(), engine.config) == before
