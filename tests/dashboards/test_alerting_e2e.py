"""End to end: Prometheus scrapes `governor serve`, a rule fires, Alertmanager posts to a webhook with the bearer token.

The rules are the shipped generator's, rendered with a test SLO every real request breaks and short windows; the
Alertmanager config is the shipped one, pointed at a loopback receiver that stands in for the controller's /alerts.
"""
from pathlib import Path

import httpx
import yaml

from dashboards.rules import Thresholds, render
from tests.dashboards.servers import Server, WebhookReceiver, binary, free_port

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
WEBHOOK_TOKEN = "alertmanager-to-controller-token"
ALERT = "GovernorInterTokenLatencyHigh"


def _alertmanager_config(receiver_port: int, token_file: Path) -> dict:
    config = yaml.safe_load((DASHBOARDS / "alertmanager" / "alertmanager.yml").read_text())
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1m")
    webhook = config["receivers"][0]["webhook_configs"][0]
    webhook["url"] = f"http://127.0.0.1:{receiver_port}/alerts"
    webhook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


def _prometheus_config(governor_port: int, alertmanager_port: int, rules: Path) -> dict:
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
            "scrape_configs": [{"job_name": "governor",
                                "static_configs": [{"targets": [f"127.0.0.1:{governor_port}"]}]}]}


def _delivered(receiver: WebhookReceiver) -> list[tuple[dict, dict, dict]]:
    return [(headers, payload, alert) for _, headers, payload in list(receiver.posts)
            for alert in payload["alerts"] if alert["labels"]["alertname"] == ALERT]


def test_latency_alert_travels_from_prometheus_through_alertmanager_to_the_webhook(governor, tmp_path):
    governor_url, governor_server = governor
    receiver = WebhookReceiver()
    token_file = tmp_path / "admin-token"
    token_file.write_text(WEBHOOK_TOKEN + "\n")
    am_port, prom_port = free_port(), free_port()
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(_alertmanager_config(receiver.port, token_file)))
    rules = tmp_path / "rules.yml"
    rules.write_text(render(Thresholds(itl_p99_seconds=0.0001, window="10s", hold="0s", no_traffic_hold="1h")))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(
        _prometheus_config(int(governor_url.rsplit(":", 1)[1]), am_port, rules)))
    servers = []
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

        def breach_and_check() -> bool:
            reply = httpx.post(f"{governor_url}/v1/completions", timeout=120, json={
                "model": "governor-moe", "prompt": "class Stack:\n", "max_tokens": 24, "ignore_eos": True})
            assert reply.status_code == 200, reply.text
            return bool(_delivered(receiver))

        try:
            prometheus.wait_until(breach_and_check, timeout=150, what=f"{ALERT} delivered to the webhook")
        except AssertionError as error:
            raise AssertionError(f"{error}\n--- alertmanager:\n{alertmanager.log()}\n--- governor:\n"
                                 f"{governor_server.log()}") from None
        headers, payload, alert = _delivered(receiver)[0]
        assert headers["Authorization"] == f"Bearer {WEBHOOK_TOKEN}"
        assert payload["version"] == "4"
        assert payload["status"] == "firing"
        assert payload["receiver"] == "governor-controller"
        assert payload["groupLabels"] == {"alertname": ALERT}
        assert alert["status"] == "firing"
        assert alert["endsAt"] == "0001-01-01T00:00:00Z"
        assert alert["fingerprint"]
        assert alert["labels"] == {
            "alertname": ALERT, "governor_action": "rollback", "severity": "critical", "job": "governor",
            "model": "governor-moe", "instance": governor_url.removeprefix("http://")}
        assert "SLO 0.0001s" in alert["annotations"]["description"]
        assert alert["annotations"]["runbook"]
    finally:
        for server in reversed(servers):
            server.stop()
        receiver.stop()
