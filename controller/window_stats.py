"""Window arithmetic: merging windows (sub-windows of one engine, or replicas), and the figures judged on them."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from policies import Policy
from seam import Block, LatencySummary, Window

_SUMMED = {"steps", "num_drafts", "drafted_tokens", "accepted_tokens", "emitted_tokens", "prefill_tokens",
           "finished_requests", "target_forward_seconds", "draft_forward_seconds", "step_seconds", "dropped_tokens",
           "all_to_all_seconds", "shadow_lookups"}
_SUMMED_ARRAYS = {"drafted_per_position", "accepted_per_position", "expert_tokens", "dropped_per_layer",
                  "slot_tokens", "rank_tokens", "shadow_drafted_per_position", "shadow_accepted_per_position",
                  "steps_per_batch_size", "decode_cost_sums"}
_MAXED = {"batch_size_max", "queue_depth_max"}
_STEP_WEIGHTED = {"batch_size_mean", "queue_depth_mean"}
MIXED_VERSIONS = -1     # the config_version of a window whose parts served different configs


def window_from_dict(data: dict, source: str = "") -> Window:
    """The Window a remote engine's GET /admin/window returned (derived figures dropped); its switchback blocks are
    labelled with source, so blocks of several replicas pair up within each replica."""
    values = {}
    for field in dataclasses.fields(Window):
        value = data.get(field.name, field.default)
        if field.name == "blocks" and value is not None:
            value = [Block(**{**block, "source": source}) for block in value]
        elif field.name == "arms" and value is not None:
            value = {arm: window_from_dict(window, source) for arm, window in value.items()}
        elif field.name == "by_band" and value is not None:
            value = {int(band): window_from_dict(window, source) for band, window in value.items()}
        elif field.name.endswith("_seconds") and isinstance(value, dict):
            value = LatencySummary(**value)
        values[field.name] = value
    return Window(**values)


def merge_windows(windows: Sequence[Window]) -> Window:
    """One Window covering all: counters summed, means weighted by steps, maxima kept. Latency percentiles cannot
    be merged exactly; the merged p50/p90/p99 are the largest of the parts (an upper bound, safe for SLO checks)."""
    if len(windows) == 1:
        return windows[0]
    values = {}
    steps = sum(w.steps for w in windows) or 1
    for field in dataclasses.fields(Window):
        name, parts = field.name, [getattr(w, field.name) for w in windows]
        if name == "start":
            values[name] = min(parts)
        elif name == "end":
            values[name] = max(parts)
        elif name == "config_version":
            values[name] = parts[0] if len(set(parts)) == 1 else MIXED_VERSIONS
        elif name in _SUMMED:
            values[name] = sum(parts)
        elif name in _SUMMED_ARRAYS:
            values[name] = sum_arrays([p for p in parts if p is not None])
        elif name in _MAXED:
            values[name] = max(parts)
        elif name in _STEP_WEIGHTED:
            values[name] = sum(p * w.steps for p, w in zip(parts, windows)) / steps
        elif name == "blocks":
            values[name] = None if all(p is None for p in parts) else [b for p in parts for b in p or ()]
        elif name in ("arms", "by_band"):
            values[name] = _merge_keyed(parts)
        elif isinstance(parts[0], LatencySummary):
            values[name] = _merge_latency(parts)
        else:
            values[name] = parts[-1]
    return Window(**values)


def _merge_keyed(parts: list[dict | None]) -> dict | None:
    """Windows by arm (or by batch band): each key's windows merged."""
    present = [p for p in parts if p]
    if not present:
        return None
    names = dict.fromkeys(name for p in present for name in p)
    return {name: merge_windows([p[name] for p in present if name in p]) for name in names}


def sum_arrays(parts: list) -> list | None:
    """Element by element (nested lists too), a part shorter than the longest counting as 0 past its end; None if
    there are no parts."""
    if not parts:
        return None
    if not isinstance(parts[0], list):
        return sum(parts)
    length = max(len(p) for p in parts)
    return [sum_arrays([p[i] for p in parts if i < len(p)]) for i in range(length)]


def _merge_latency(parts: list[LatencySummary]) -> LatencySummary:
    parts = [p for p in parts if p.count]
    if not parts:
        return LatencySummary.of([])
    count = sum(p.count for p in parts)

    def worst(name: str) -> float:
        return max(getattr(p, name) for p in parts)
    return LatencySummary(count, sum(p.mean * p.count for p in parts) / count, worst("p50"), worst("p90"),
                          worst("p99"), worst("max"))


def tokens_per_busy_second(window: Window) -> float:
    """Emitted tokens per second the engine spent stepping: goodput that does not depend on how much traffic
    arrived (at saturation it equals goodput; below it, wall-clock goodput only measures the arrival rate)."""
    return window.emitted_tokens / window.step_seconds if window.step_seconds > 0 else 0.0


def short_of_traffic(window: Window, policy: Policy) -> bool:
    """Fewer tokens or steps than a window needs to be judged."""
    return window.emitted_tokens < policy.window.min_emitted_tokens or window.steps < policy.window.min_steps


def no_data_reason(window: Window, policy: Policy) -> str | None:
    """Why this window holds too little traffic to be judged (or measured more than one config), or None."""
    if window.config_version == MIXED_VERSIONS and not window.arms:     # an Experiment's arms are measured apart
        return "no data: the window's parts (replicas or checks) served different config versions"
    if window.emitted_tokens < policy.window.min_emitted_tokens:
        return f"no data: {window.emitted_tokens} tokens emitted, a window needs {policy.window.min_emitted_tokens}"
    if window.steps < policy.window.min_steps:
        return f"no data: {window.steps} engine steps, a window needs {policy.window.min_steps}"
    return None


def slo_breaches(window: Window, policy: Policy) -> list[str]:
    """The policy SLOs this window's latency breaks, as readable sentences."""
    breaches = []
    for name, summary, bound in (("inter-token p99", window.inter_token_seconds, policy.slo.inter_token_p99_seconds),
                                 ("TTFT p99", window.ttft_seconds, policy.slo.ttft_p99_seconds)):
        if bound is not None and summary.count and summary.p99 > bound:
            breaches.append(f"{name} {summary.p99:.4f} s > {bound} s")
    return breaches


def window_summary(window: Window) -> dict:
    """The figures a decision records as its inputs."""
    return {"config_version": window.config_version, "spec_method": window.spec_method, "draft_len": window.draft_len,
            "seconds": round(window.duration_seconds, 3), "steps": window.steps,
            "emitted_tokens": window.emitted_tokens, "tokens_per_busy_second": round(tokens_per_busy_second(window), 2),
            "goodput_tokens_per_second": round(window.goodput_tokens_per_second, 2),
            "acceptance_rate": window.acceptance_rate, "batch_size_mean": round(window.batch_size_mean, 2),
            "batch_size_median": window.batch_size_median,
            "inter_token_p99_seconds": window.inter_token_seconds.p99, "ttft_p99_seconds": window.ttft_seconds.p99}
