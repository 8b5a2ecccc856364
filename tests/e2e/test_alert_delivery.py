"""Alert actions at least once with an exactly-once effect, against real `governor serve` processes: a kill -9
between recording an alert and acting on it, then redeliveries across restarts."""
import signal

import httpx
import pytest

from tests.controller.test_alerts import _payload
from tests.e2e.serving import decisions, post_alerts, start_serve, write_policy


def test_an_alert_recorded_but_not_acted_on_before_a_kill_is_acted_on_once_after_restarts(tmp_path):
    flags = ("--db", f"sqlite:///{tmp_path / 'g.db'}", "--policy", str(write_policy(tmp_path)))
    payload = _payload(fingerprint="0badcafe")
    url, doomed = start_serve(tmp_path, "governor-killed", *flags, injected={"GOVERNOR_TEST_KILL_BEFORE": "rollback"})
    with pytest.raises(httpx.HTTPError):
        post_alerts(url, payload)           # recorded, then the process dies before the rollback
    assert doomed.process.wait(timeout=30) == -signal.SIGKILL

    servers = []
    try:
        url, server = start_serve(tmp_path, "governor-restarted", *flags)
        servers.append(server)
        first = decisions(url, "rollback")
        reply = post_alerts(url, payload)   # Alertmanager delivers again: the action never succeeded, so it runs
        assert reply.status_code == 200 and reply.json()["acted"][0]["outcome"] == "acted"
        assert len(decisions(url, "rollback")) == len(first) + 1
        assert post_alerts(url, payload).json()["duplicates"] == 1
        server.stop()

        url, server = start_serve(tmp_path, "governor-restarted-again", *flags)
        servers.append(server)
        again = post_alerts(url, payload)   # after a clean restart too, a settled alert is a no-op answered 200
        assert again.status_code == 200 and again.json()["duplicates"] == 1
        rollbacks = decisions(url, "rollback")
        assert len(rollbacks) == len(first) + 1 and rollbacks[0]["inputs"]["fingerprint"] == "0badcafe"
        (alert,) = httpx.get(f"{url}/admin/alerts").json()["alerts"]
        assert (alert["fingerprint"], alert["outcome"]) == ("0badcafe", "acted")
        assert alert["decision_id"] == rollbacks[0]["id"]
    finally:
        for server in servers:
            server.stop()
