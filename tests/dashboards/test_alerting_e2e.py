"""End to end: a real Prometheus scrapes `governor serve`, the shipped inter-token latency rule fires once an injected
slow-down breaks its SLO, and a real Alertmanager (the shipped config) posts to that server's own /alerts with the
admin token: the controller records exactly one rollback, within two windows of the alert firing.

The rules are the shipped generator's with short windows; the rules that would act on something else in this test
(acceptance, balance, drops, no traffic) get thresholds they cannot reach. The slow-down is tests.e2e.injected_serve's.
"""
import datetime as dt
import threading
from pathlib import Path

import httpx
import yaml

from dashboards.rules import Thresholds, render
from tests.controller.conftest import fast_policy
from tests.controller.server import TOKEN
from tests.dashboards.servers import Server, binary, free_port
from tests.e2e.serving import decisions, start_serve, write_policy

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
ALERT = "GovernorInterTokenLatencyHigh"
WINDOW_SECONDS = 10.0
POLICY = fast_policy(window={"seconds": WINDOW_SECONDS, "checks": 2}, trial={"min_predicted_gain": 100.0},
                     slo={"inter_token_p99_seconds": None, "ttft_p99_seconds": None, "builtin_evaluator": False})
RULES = Thresholds(itl_p99_seconds=0.25, window="5s", hold="0s", no_traffic_hold="1h", acceptance_min=0.0,
                   balancedness_min=0.0, drop_ratio_max=1.0, ttft_p99_seconds=1000.0)


def _alertmanager_config(governor_url: str, token_file: Path) -> dict:
    config = yaml.safe_load((DASHBOARDS / "alertmanager" / "alertmanager.yml").read_text())
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1m")
    webhook = config["receivers"][0]["webhook_configs"][0]
    webhook["url"] = f"{governor_url}/alerts"
    webhook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


def _prometheus_config(governor_port: int, alertmanager_port: int, rules: Path) -> dict:
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
            "scrape_configs": [{"job_name": "governor",
                                "static_configs": [{"targets": [f"127.0.0.1:{governor_port}"]}]}]}


class _Traffic:
    """Sequential completions from a thread until stopped."""

    def __init__(self, url: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        while not self._stop.is_set():
            httpx.post(f"{url}/v1/completions", timeout=120, json={
                "model": "governor-moe", "prompt": "class Stack:\n", "max_tokens": 24, "ignore_eos": True})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def _parse(timestamp: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def test_a_slow_down_fires_the_shipped_rule_and_alertmanager_makes_the_controller_roll_back_once(tmp_path):
    slow = tmp_path / "slow-steps"
    governor_url, governor = start_serve(tmp_path, "governor", "--db", f"sqlite:///{tmp_path / 'g.db'}",
                                         "--policy", str(write_policy(tmp_path, POLICY)),
                                         injected={"GOVERNOR_TEST_SLOW_STEPS_FILE": str(slow)})
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    am_port, prom_port = free_port(), free_port()
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(_alertmanager_config(governor_url, token_file)))
    rules = tmp_path / "rules.yml"
    rules.write_text(render(RULES))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(
        _prometheus_config(int(governor_url.rsplit(":", 1)[1]), am_port, rules)))
    servers, traffic = [governor], None
    try:
        alertmanager = Server("alertmanager", [
            binary("prometheus-alertmanager"), f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address="], tmp_path)
        servers.append(alertmanager)
        prometheus = Server("prometheus", [
            binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
            "--rules.alert.resend-delay=1s"], tmp_path)
        servers.append(prometheus)
        alertmanager.wait_ready(f"http://127.0.0.1:{am_port}/-/ready", timeout=60)
        prometheus.wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", timeout=60)
        traffic = _Traffic(governor_url)
        query = f"http://127.0.0.1:{prom_port}/api/v1/query"
        prometheus.wait_until(lambda: httpx.get(query, params={"query": "governor:generation_tokens:rate > 0"})
                              .json()["data"]["result"], timeout=60, what="a generation rate from the scrapes")
        assert not decisions(governor_url, "rollback")      # at normal speed the SLO holds

        slow.touch()
        try:
            governor.wait_until(lambda: decisions(governor_url, "rollback"), timeout=120,
                                what=f"a rollback after {ALERT} fired")
        except AssertionError as error:
            raise AssertionError(f"{error}\n--- alertmanager:\n{alertmanager.log()}") from None
        firing = [a for a in httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/alerts").json()["data"]["alerts"]
                  if a["labels"]["alertname"] == ALERT]
        slow.unlink()
        (rollback,) = decisions(governor_url, "rollback")
        assert rollback["inputs"]["alert"] == ALERT and rollback["inputs"]["source"] == "alertmanager"
        fired_at = min(_parse(a["activeAt"]) for a in firing)
        assert (_parse(rollback["at"]) - fired_at).total_seconds() <= 2 * WINDOW_SECONDS
        (alert,) = [a for a in httpx.get(f"{governor_url}/admin/alerts").json()["alerts"] if a["name"] == ALERT]
        assert alert["labels"]["governor_action"] == "rollback" and alert["labels"]["job"] == "governor"
        assert alert["status"] == "firing" and alert["source"] == "alertmanager"
        assert (alert["outcome"], alert["decision_id"]) == ("acted", rollback["id"])

        governor.wait_until(lambda: any(a["status"] == "resolved" for a in httpx.get(
            f"{governor_url}/admin/alerts").json()["alerts"]), timeout=60, what=f"{ALERT} resolved")
        assert len(decisions(governor_url, "rollback")) == 1     # redeliveries and the resolution act no more
    finally:
        if traffic is not None:
            traffic.stop()
        for server in reversed(servers):
            server.stop()
