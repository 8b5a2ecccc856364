"""Prometheus recording and alert rules for Governor, rendered from thresholds.

The shipped file is `dashboards/prometheus/governor-rules.yml` (the defaults below). Render your own SLOs with
`python -m dashboards.rules --itl-p99-seconds 0.1 > rules.yml`; every ratio is guarded so that no traffic (0/0)
gives no series, and only GovernorNoTraffic speaks about that case. Each alert names in its label
`governor_action` what the controller does about it (rollback, disable_speculation, pin, notify).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields

import yaml

BY = "job, instance, model"
ACTIONS = ("rollback", "disable_speculation", "pin", "notify")


@dataclass(frozen=True)
class Thresholds:
    acceptance_min: float = 0.3          # accepted / drafted tokens
    itl_p99_seconds: float = 0.25        # inter-token latency SLO
    ttft_p99_seconds: float = 2.0        # time-to-first-token SLO
    balancedness_min: float = 0.6        # mean / max tokens per rank (vLLM)
    drop_ratio_max: float = 0.05         # dropped / routed token assignments
    window: str = "5m"                   # rate() window of every recorded ratio and quantile
    hold: str = "5m"                     # how long a condition must last before its alert fires
    no_traffic_hold: str = "10m"
    component_down_hold: str = "1m"      # longer than an expert-parallel respawn takes


def _ratio(numerator: str, denominator: str, by: str = BY) -> str:
    """sum(rate(n)) / sum(rate(d)), with no series at all where d did not move (no traffic)."""
    return (f"sum by ({by}) (rate({numerator}[$w]))\n"
            f"  / (sum by ({by}) (rate({denominator}[$w])) > 0)")


def _quantile(q: float, histogram: str) -> str:
    return (f"histogram_quantile({q}, sum by ({BY}, le) (rate({histogram}_bucket[$w])))\n"
            f"  and on ({BY}) (sum by ({BY}) (rate({histogram}_count[$w])) > 0)")


def recording_rules() -> list[dict]:
    accepted = "governor_spec_decode_num_accepted_tokens_total"
    rules = [
        {"record": "governor:generation_tokens:rate",
         "expr": f"sum by ({BY}) (rate(governor_generation_tokens_total[$w]))"},
        {"record": "governor:spec_decode_acceptance:ratio",
         "expr": _ratio(accepted, "governor_spec_decode_num_draft_tokens_total")},
        {"record": "governor:spec_decode_mean_acceptance_length",
         "expr": "1 + " + _ratio(accepted, "governor_spec_decode_num_drafts_total")},
        {"record": "governor:spec_decode_acceptance_per_pos:ratio",
         "expr": _ratio("governor_spec_decode_num_accepted_tokens_per_pos_total",
                        "governor_spec_decode_num_draft_tokens_per_pos_total", f"{BY}, position")},
    ]
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        for q in (0.5, 0.9, 0.99):
            rules.append({"record": f"governor:{name}:p{round(q * 100)}", "expr": _quantile(q, f"governor_{name}")})
    rules += [
        {"record": "governor:moe_comm_share:ratio",
         "expr": _ratio("governor_moe_all_to_all_seconds_total", "governor_step_duration_seconds_sum")},
        {"record": "governor:moe_drop:ratio",
         "expr": _ratio("governor_moe_dropped_tokens_total", "governor_expert_tokens_total")},
        {"record": "governor:moe_balancedness:ratio",
         "expr": (f"sum by ({BY}) (avg by ({BY}, layer) (rate(governor_moe_rank_tokens_total[$w])))\n"
                  f"  / (sum by ({BY}) (max by ({BY}, layer) (rate(governor_moe_rank_tokens_total[$w]))) > 0)")},
    ]
    return rules


def _alert(name: str, expr: str, hold: str, action: str, severity: str, summary: str, description: str,
           runbook: str) -> dict:
    return {"alert": name, "expr": expr, "for": hold,
            "labels": {"severity": severity, "governor_action": action},
            "annotations": {"summary": summary, "description": description, "runbook": runbook}}


def alert_rules(t: Thresholds) -> list[dict]:
    where = "{{ $labels.model }} on {{ $labels.instance }}"
    return [
        _alert("GovernorAcceptanceCollapse", f"governor:spec_decode_acceptance:ratio < {t.acceptance_min}", t.hold,
               "disable_speculation", "warning", f"Speculative decoding acceptance collapsed ({where})",
               f"Only {{{{ $value | humanizePercentage }}}} of drafted tokens were accepted over the last "
               f"{t.window} (threshold {t.acceptance_min:.0%}); drafting now costs more than it saves.",
               "The controller turns speculation off. Check whether the traffic mix changed (per-position "
               "acceptance panel) and whether the draft model matches the target; re-enable once acceptance recovers."),
        _alert("GovernorInterTokenLatencyHigh", f"governor:inter_token_latency_seconds:p99 > {t.itl_p99_seconds}",
               t.hold, "rollback", "critical", f"p99 inter-token latency above its SLO ({where})",
               f"p99 inter-token latency is {{{{ $value | humanizeDuration }}}} over the last {t.window} "
               f"(SLO {t.itl_p99_seconds}s).",
               "The controller rolls back to the last-known-good config. If it persists there, compare batch size and "
               "queue depth with the draft length: large k at high concurrency slows every step."),
        _alert("GovernorTimeToFirstTokenHigh", f"governor:time_to_first_token_seconds:p99 > {t.ttft_p99_seconds}",
               t.hold, "rollback", "critical", f"p99 time to first token above its SLO ({where})",
               f"p99 time to first token is {{{{ $value | humanizeDuration }}}} over the last {t.window} "
               f"(SLO {t.ttft_p99_seconds}s).",
               "The controller rolls back to the last-known-good config. A growing queue depth means the engine is "
               "over capacity: shed load or add replicas."),
        _alert("GovernorExpertImbalance", f"governor:moe_balancedness:ratio < {t.balancedness_min}", t.hold,
               "notify", "warning", f"MoE expert load is unbalanced across ranks ({where})",
               f"Balancedness (mean / max tokens per rank) is {{{{ $value | humanizePercentage }}}} over the last "
               f"{t.window} (threshold {t.balancedness_min:.0%}).",
               "Look at the expert-heat panel for hot experts; the controller's placement rule should replicate them. "
               "If balancedness stays low after a rebalance, plan a placement with `governor plan`."),
        _alert("GovernorTokenDropRateHigh", f"governor:moe_drop:ratio > {t.drop_ratio_max}", t.hold,
               "rollback", "warning", f"MoE layers drop too many token assignments ({where})",
               f"{{{{ $value | humanizePercentage }}}} of routed token assignments were dropped over capacity in the "
               f"last {t.window} (threshold {t.drop_ratio_max:.0%}).",
               "The controller rolls back to the last-known-good config. Raise capacity_factor (0 = dropless) or "
               "rebalance the placement."),
        _alert("GovernorComponentDown", "governor_up == 0", t.component_down_hold, "notify", "critical",
               f"Governor component {{{{ $labels.component }}}} is down ({where})",
               f"{{{{ $labels.component }}}} has reported a fault for {t.component_down_hold}; /health answers 503 "
               "with the reason.",
               "Read the reason on /health. A dead expert-parallel rank is respawned by itself (the process exits 1 "
               "after 3 failed respawns in a minute, for its supervisor to restart it); a dead controller thread or "
               "an unwritable store needs a restart or a look at the database."),
        _alert("GovernorRequestsFailing",
               f"sum by ({BY}, cause) (rate(governor_request_errors_total[$w])) > 0", t.hold, "notify", "warning",
               f"Requests fail with a 5xx ({where})",
               f"{{{{ $value | humanize }}}} requests/s failed over the last {t.window}, cause "
               "{{ $labels.cause }}.",
               "engine_unavailable: the engine refused requests (respawning, stalled or stopped): see /health. "
               "expert_parallel_rank_failed: a rank died mid-request. engine_step_failed: the engine log has the "
               "traceback."),
        _alert("GovernorNoTraffic",
               "governor:generation_tokens:rate == 0\nor on () absent(governor_generation_tokens_total)",
               t.no_traffic_hold, "pin", "info", "Governor serves no traffic",
               f"No tokens were generated for {t.no_traffic_hold}, or no Governor is scraped at all; windows "
               "without traffic cannot judge a config.",
               "The controller pins the current config and stops trials until traffic returns. Check the load "
               "balancer and that Prometheus scrapes /metrics (the `up` series)."),
    ]


def render(t: Thresholds = Thresholds()) -> str:
    rules = recording_rules() + alert_rules(t)
    for rule in rules:
        rule["expr"] = rule["expr"].replace("$w", t.window)
    header = ("# Generated by `python -m dashboards.rules` (dashboards/rules.py); edit thresholds there or render\n"
              "# your own with its flags. Checked by `promtool check rules` and `promtool test rules`.\n")
    return header + yaml.dump({"groups": [{"name": "governor", "rules": rules}]}, Dumper=_Dumper, sort_keys=False,
                              width=120)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, so the file reads like hand-written rules."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.rules", description=__doc__.split("\n\n")[0])
    for field in fields(Thresholds):
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    sys.stdout.write(render(Thresholds(**{f.name: getattr(args, f.name) for f in fields(Thresholds)})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
