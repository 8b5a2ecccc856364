"""The controller's admin API on a real loopback server: open reads, token-guarded writes, pin/release/rollback,
policy switch, and one route per path and method in the served app."""
import time

import httpx
import pytest
import yaml

from controller.clients import InProcessClient
from controller.operate.actions import Operator
from controller.plane import build_control_plane
from controller.store import AlertRecord, ConfigVersion, Decision
from engine.server.service import EngineService
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.controller.server import AUTH, TOKEN, serving
from tests.engine.helpers import make_engine


@pytest.fixture
def plane(moe_models, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(fast_policy()))
    service = EngineService(make_engine(moe_models, EngineConfig(draft_len=3)))
    return service, build_control_plane(InProcessClient(service.engine), str(path),
                                        f"sqlite:///{tmp_path / 'g.db'}", TOKEN)


@pytest.fixture
def api(plane):
    service, control = plane
    with serving(service, control) as url:
        yield url, control.controller, service.engine


def test_reads_are_open(api):
    url, controller, _ = api
    assert httpx.get(f"{url}/admin/config").json()["draft_len"] == 3
    assert httpx.get(f"{url}/admin/decisions").json()["decisions"][0]["action"] == "start"
    history = httpx.get(f"{url}/admin/history").json()
    assert history["last_known_good"] == history["versions"][0]["id"]
    assert httpx.get(f"{url}/admin/policy").json()["policy"]["kind"] == "rules"
    assert httpx.get(f"{url}/admin/window").status_code == 404     # no window closed yet: said, not invented


@pytest.mark.parametrize("method, path", [("put", "/admin/config"), ("post", "/admin/release"),
                                          ("post", "/admin/rollback"), ("put", "/admin/policy"), ("post", "/alerts"),
                                          ("post", "/admin/search/start"), ("post", "/admin/search/stop")])
def test_every_write_needs_the_token(api, method, path):
    url, controller, _ = api
    before = controller.store.count(Decision)
    reply = httpx.request(method, f"{url}{path}", json={"draft_len": 2})
    assert reply.status_code == 401
    assert controller.store.count(Decision) == before


def test_put_config_pins_until_released(api):
    url, controller, engine = api
    reply = httpx.put(f"{url}/admin/config", json={"spec_method": "draft_model", "draft_len": 6}, headers=AUTH)
    assert reply.status_code == 200, reply.text
    pinned = reply.json()["config"]
    assert pinned["draft_len"] == 6 and pinned["version"] > 1
    assert httpx.get(f"{url}/admin/controller").json()["pin"]["owner"] == "operator"
    assert controller.store.pin().config_version == pinned["version"]
    released = httpx.post(f"{url}/admin/release", headers=AUTH)
    assert released.status_code == 200
    assert controller.last_known_good.draft_len == 6     # the operator's config becomes the last known good
    assert httpx.post(f"{url}/admin/release", headers=AUTH).status_code == 409


def test_bad_config_is_400_naming_the_field_and_changes_nothing(api):
    url, controller, _ = api
    before = controller.current
    reply = httpx.put(f"{url}/admin/config", json={"draft_len": 99}, headers=AUTH)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "draft_len"
    assert controller.current == before and controller.store.pin() is None


def test_rollback_restores_the_last_known_good(api):
    url, controller, engine = api
    good = controller.last_known_good
    httpx.put(f"{url}/admin/config", json={"draft_len": 7}, headers=AUTH)
    reply = httpx.post(f"{url}/admin/rollback", headers=AUTH)
    assert reply.status_code == 200 and reply.json()["config"] == good.model_dump()
    assert controller.store.count(Decision, action="rollback") == 1


def test_policy_switch_by_name_and_by_document(api):
    url, controller, _ = api
    assert httpx.put(f"{url}/admin/policy", json={"name": "default"}, headers=AUTH).status_code == 200
    assert controller.policy_name == "default"
    bad = httpx.put(f"{url}/admin/policy", json={"policy": {"slo": {"ttft_p99_seconds": -1}}}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "slo.ttft_p99_seconds"
    assert httpx.put(f"{url}/admin/policy", json={"name": "nope"}, headers=AUTH).status_code == 400
    assert controller.policy_name == "default"


def test_an_optuna_search_starts_and_stops_back_to_the_policy_before_it(api):
    url, controller, _ = api
    before = controller.policy_name
    assert httpx.post(f"{url}/admin/search/stop", headers=AUTH).status_code == 409     # none is running
    started = httpx.post(f"{url}/admin/search/start", headers=AUTH)
    assert started.status_code == 200 and started.json()["name"] == "optuna"
    assert controller.policy.kind == "optuna" and controller.strategy.name == "optuna"
    again = httpx.post(f"{url}/admin/search/start", headers=AUTH)
    assert again.status_code == 409 and "already running" in again.json()["error"]["message"]
    stopped = httpx.post(f"{url}/admin/search/stop", headers=AUTH)
    assert stopped.status_code == 200 and stopped.json()["name"] == before
    assert controller.policy.kind == "rules"
    assert controller.store.count(Decision, action="policy_switch") == 2


def test_a_search_running_from_the_start_stops_to_the_default_policy(api):
    url, controller, _ = api
    assert httpx.put(f"{url}/admin/policy", json={"name": "optuna"}, headers=AUTH).status_code == 200
    assert httpx.post(f"{url}/admin/search/stop", headers=AUTH).json()["name"] == "default"
    assert controller.policy.kind == "rules"


def test_a_pinned_config_is_respected_by_the_loop(plane, prompts):
    service, control = plane
    controller, engine = control.controller, service.engine
    Operator(controller).pin(EngineConfig(draft_len=1), "operator", "hold k=1")
    from tests.controller.traffic import ClosedLoopTraffic
    with ClosedLoopTraffic(engine, prompts):
        for _ in range(4):
            time.sleep(controller.policy.window.seconds)
            controller.tick()
    assert controller.store.count(Decision, action="trial") == 0
    assert engine.config.draft_len == 1


def test_served_app_documents_the_controllers_routes(api):
    url, controller, _ = api
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    for path, method in [("/admin/window", "get"), ("/admin/config", "put"), ("/admin/rollback", "post"),
                         ("/admin/release", "post"), ("/admin/policy", "put"), ("/alerts", "post"),
                         ("/admin/search/start", "post"), ("/admin/search/stop", "post"),
                         ("/admin/decisions", "get"), ("/admin/history", "get"), ("/v1/completions", "post")]:
        assert method in paths[path], (path, method)


def test_without_a_controller_the_engine_serves_its_own_seam_and_reads_destroy_nothing(moe_models):
    service = EngineService(make_engine(moe_models, EngineConfig(draft_len=3)))
    completion = {"model": "governor-moe", "prompt": "def f(x):\n", "max_tokens": 8, "ignore_eos": True}
    with serving(service, None) as url:
        assert httpx.get(f"{url}/admin/window").status_code == 404      # as with a controller: none closed yet
        assert httpx.get(f"{url}/admin/window?reader=dashboard").json()["emitted_tokens"] == 0   # a new reader
        assert httpx.post(f"{url}/v1/completions", json=completion, timeout=60).status_code == 200
        assert httpx.get(f"{url}/admin/window?reader=dashboard").json()["emitted_tokens"] == 8   # another reader's
        closed = httpx.get(f"{url}/admin/window?reader=controller").json()                       # the controller's
        assert closed["emitted_tokens"] == 8
        assert httpx.get(f"{url}/admin/window").json() == httpx.get(f"{url}/admin/window").json() == closed
        assert httpx.get(f"{url}/admin/window?reader=controller").json()["emitted_tokens"] == 0
        assert httpx.get(f"{url}/admin/window?reader=no%20spaces").json()["error"]["param"] == "reader"
        assert "/admin/decisions" not in httpx.get(f"{url}/openapi.json").json()["paths"]


def _unchanged(controller, engine):
    """What a refused write must leave as it was: config, pin, version history, decisions, policy, engine."""
    store = controller.store
    return (controller.current, controller.last_known_good, store.pin(), store.count(ConfigVersion),
            store.count(Decision), controller.policy, controller.policy_name, engine.config)


@pytest.mark.parametrize("body, field", [
    (b"{not json", "body"),
    (b"[1, 2]", "body"),
    (b'{"draft_len": -1}', "draft_len"),
    (b'{"draft_len": "four"}', "draft_len"),
    (b'{"spec_method": "medusa"}', "spec_method"),
    (b'{"draft_len": 2, "speed": "max"}', "speed"),
    (b'{"capacity_factor": -0.5}', "capacity_factor"),
])
def test_put_config_refuses_malformed_bodies_and_changes_nothing(api, body, field):
    url, controller, engine = api
    httpx.put(f"{url}/admin/config", json={"draft_len": 5}, headers=AUTH)     # a pin a bad body must not disturb
    before = _unchanged(controller, engine)
    reply = httpx.put(f"{url}/admin/config", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: ")
    assert _unchanged(controller, engine) == before


@pytest.mark.parametrize("body, field", [
    ({"name": "default", "policy": {"kind": "rules"}}, "body"),
    ({}, "body"),
    ({"policy": {"window": {"seconds": 0}}}, "window.seconds"),
    ({"policy": {"speculation": {"min_gain": 0.5}}}, "speculation.min_gain"),
    ({"policy": {"kind": "bandit"}}, "kind"),
    ({"policy": {"alerts": {"overrides": {"X": "reboot"}}}}, "alerts.overrides.X"),
    ({"name": "../default"}, "name"),
    ({"name": "default", "force": True}, "force"),
])
def test_bad_policy_switch_is_400_and_leaves_the_policy_in_force(api, body, field):
    url, controller, engine = api
    before = _unchanged(controller, engine)
    reply = httpx.put(f"{url}/admin/policy", json=body, headers=AUTH)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field
    assert _unchanged(controller, engine) == before
    assert controller.store.count(Decision, action="policy_switch") == 0


def test_malformed_webhook_json_is_400_and_records_nothing(api):
    url, controller, engine = api
    before = _unchanged(controller, engine)
    reply = httpx.post(f"{url}/alerts", content=b'{"version": "4", "alerts": [', headers={
        **AUTH, "Content-Type": "application/json"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "body"
    assert _unchanged(controller, engine) == before and controller.store.count(AlertRecord) == 0
