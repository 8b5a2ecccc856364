"""The Grafana dashboard: valid JSON whose queries use only metrics the service exports or the rules record."""
import json
import re
from pathlib import Path

import pytest
import yaml

from controller.counters import PrometheusCounters
from engine.telemetry.metrics import EngineMetrics

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads((DASHBOARDS / "grafana" / "governor.json").read_text())


def _panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _exported_names() -> set[str]:
    """Every sample name /metrics serves (the engine's and the controller's counters); labelled families show their
    TYPE line before any sample."""
    metrics = EngineMetrics("m")
    PrometheusCounters(metrics.registry, "m")
    text = metrics.exposition().decode()
    return {name + suffix for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
            for suffix in SUFFIXES[kind]}


def _recorded_names() -> set[str]:
    rules = yaml.safe_load((DASHBOARDS / "prometheus" / "governor-rules.yml").read_text())
    return {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p["targets"]]
    return exprs + [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]


def test_every_query_uses_only_known_metrics(dashboard):
    known = _exported_names() | _recorded_names()
    used = {name for expr in _queries(dashboard) for name in re.findall(r"\bgovernor[a-z0-9_:]*", expr)}
    assert used, "no governor metric in any query"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"


def test_every_panel_filters_by_the_model_and_instance_variables(dashboard):
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "model", "instance"} <= variables
    for panel in _panels(dashboard):
        for target in panel["targets"]:
            assert 'model=~"$model"' in target["expr"] and 'instance=~"$instance"' in target["expr"], panel["title"]


def test_panels_cover_latency_speculation_moe_and_the_controller(dashboard):
    used = " ".join(_queries(dashboard))
    for metric in ("governor_time_to_first_token_seconds_bucket", "governor_inter_token_latency_seconds_bucket",
                   "governor_e2e_request_latency_seconds_bucket", "governor_generation_tokens_total",
                   "governor_spec_decode_num_accepted_tokens_per_pos_total", "governor_spec_decode_num_drafts_total",
                   "governor_moe_all_to_all_seconds_total", "governor_moe_rank_tokens_total",
                   "governor_moe_dropped_tokens_total", "governor_config_info",
                   "governor_controller_decisions_total", "governor_controller_rollbacks_total"):
        assert metric in used, metric
    heatmaps = [p for p in _panels(dashboard) if p["type"] == "heatmap"]
    assert heatmaps and "governor_expert_tokens_total" in heatmaps[0]["targets"][0]["expr"]


def test_ratio_panels_show_no_traffic_instead_of_nan(dashboard):
    ratios = [p for p in _panels(dashboard) if " / " in " ".join(t["expr"] for t in p["targets"])
              and "histogram_quantile" not in p["targets"][0]["expr"]]
    assert ratios
    for panel in ratios:
        mappings = panel["fieldConfig"]["defaults"].get("mappings", [])
        assert any(m["type"] == "special" and "nan" in m["options"]["match"]
                   and m["options"]["result"]["text"] == "No traffic" for m in mappings), panel["title"]


def test_panel_ids_are_unique(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
