"""The shipped Prometheus rules, their promtool unit tests, and the example Prometheus and Alertmanager configs."""
import subprocess
from pathlib import Path

import yaml

from dashboards.rules import ACTIONS, Thresholds, main, render
from tests.dashboards.servers import binary

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
RULES = DASHBOARDS / "prometheus" / "governor-rules.yml"
RULE_TESTS = DASHBOARDS / "prometheus" / "governor-rules.test.yml"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def test_shipped_rules_are_the_generators_defaults():
    assert RULES.read_text() == render(Thresholds())


def test_generator_renders_the_thresholds_it_is_given(capsys):
    assert main(["--itl-p99-seconds", "0.05", "--window", "1m"]) == 0
    rules = yaml.safe_load(capsys.readouterr().out)["groups"][0]["rules"]
    itl = next(r for r in rules if r.get("alert") == "GovernorInterTokenLatencyHigh")
    assert itl["expr"] == "governor:inter_token_latency_seconds:p99 > 0.05"
    assert all("[5m]" not in r["expr"] for r in rules)


def test_promtool_check_rules_accepts_the_shipped_rules():
    result = _run(binary("promtool"), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass():
    result = _run(binary("promtool"), "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_unit_tested_firing_and_silent_without_data():
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {c["alertname"] for t in cases for c in t.get("alert_rule_test", []) if c["exp_alerts"]}
    no_series = next(t for t in cases if t["name"].startswith("no series at all"))
    silent = {c["alertname"] for c in no_series["alert_rule_test"] if not c["exp_alerts"]}
    names = {a["alert"] for a in _alerts()}
    assert names == fired
    assert silent == names - {"GovernorNoTraffic"}


def test_every_alert_names_its_action_severity_and_what_to_do():
    for alert in _alerts():
        assert alert["labels"]["governor_action"] in ACTIONS, alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert set(alert["annotations"]) == {"summary", "description", "runbook"}, alert["alert"]
        if alert["alert"] not in ("GovernorNoTraffic", "GovernorComponentDown"):    # conditions without a figure
            assert "$value" in alert["annotations"]["description"], alert["alert"]


def test_example_prometheus_config_is_valid_and_loads_the_rules():
    result = _run(binary("promtool"), "check", "config", str(DASHBOARDS / "prometheus" / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert f"{len(rules)} rules found" in result.stdout


def test_alertmanager_config_posts_every_alert_to_the_controller_with_a_bearer_token():
    path = DASHBOARDS / "alertmanager" / "alertmanager.yml"
    result = _run(binary("amtool"), "check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(path.read_text())
    assert config["route"]["group_by"] == ["alertname"]
    [receiver] = config["receivers"]
    assert receiver["name"] == config["route"]["receiver"]
    [webhook] = receiver["webhook_configs"]
    assert webhook["url"] == "http://127.0.0.1:8000/alerts"
    assert webhook["http_config"]["authorization"]["type"] == "Bearer"
    assert webhook["http_config"]["authorization"]["credentials_file"]
