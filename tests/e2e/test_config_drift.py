"""The controller against a real engine process (`governor serve --no-controller`): a write behind its back is
re-applied within one tick; an apply that fails (the engine went away) leaves `current` as it was and is retried
every tick until a restarted engine takes it; a replica that does not answer marks the fleet degraded, and the loop
goes on."""
import httpx
import pytest

from controller import Controller, Store
from controller.clients import ApplyFailed, HttpClient
from controller.operate.actions import Operator
from controller.store import Decision
from policies import parse_policy
from tests.controller.server import AUTH, TOKEN
from tests.dashboards.servers import free_port
from tests.e2e.serving import QUIET_POLICY, start_serve


def test_drift_is_reapplied_and_a_failed_apply_changes_nothing_until_it_succeeds(tmp_path):
    port, nobody = free_port(), f"http://127.0.0.1:{free_port()}"
    url, engine = start_serve(tmp_path, "engine", "--no-controller", port=port)
    try:
        controller = Controller(HttpClient([url, nobody], TOKEN), Store(f"sqlite:///{tmp_path / 'g.db'}"),
                                parse_policy(QUIET_POLICY, "quiet"))
        good = controller.current
        assert set(controller.client.degraded) == {nobody}     # a dead replica is reported, not fatal

        behind_its_back = good.changed(draft_len=good.draft_len + 1, version=0)
        httpx.put(f"{url}/admin/config", content=behind_its_back.model_dump_json(), headers=AUTH)
        controller.tick()                                       # one tick: the version check re-applies
        assert httpx.get(f"{url}/admin/config").json() == good.model_dump()
        (reapplied,) = controller.store.rows(Decision, action="reapply")
        assert reapplied["inputs"]["drifted"] == {url: 0}

        pinned = controller.current.changed(draft_len=good.draft_len + 2)
        Operator(controller).pin(pinned, "operator", "test pin")
        held = controller.current
        engine.stop()                                           # the injected fault: every apply now fails
        with pytest.raises(ApplyFailed):
            Operator(controller).rollback("operator rollback while the engine is down", lift_pin=True)
        assert controller.current == held and controller.state()["converging_to"] == good.version

        url, engine = start_serve(tmp_path, "engine-restarted", "--no-controller", port=port)
        assert httpx.get(f"{url}/admin/config").json()["version"] == 0   # a fresh engine, on its own config
        controller.tick()
        assert controller.current == good and httpx.get(f"{url}/admin/config").json() == good.model_dump()
        assert controller.store.count(Decision, action="reapply") == 2
    finally:
        engine.stop()
