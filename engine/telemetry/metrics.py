"""Prometheus exposition of the engine's measurements: cumulative counters and histograms, one registry per engine.

Fed by Telemetry with the very events that build the Window, so /metrics and the controller never disagree.
Names follow vLLM's spec-decode counters where the meaning is the same (see dashboards/README.md for PromQL).
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE  # noqa: F401  (re-exported)
from prometheus_client.registry import Collector

from engine.telemetry.recorder import StepRecord
from seam import EngineConfig

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
               0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 300.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class EngineMetrics:
    """A TelemetrySink that keeps Prometheus metrics for one engine serving `model`."""

    def __init__(self, model: str):
        self.registry = CollectorRegistry()
        self._config = _ConfigInfo(model)
        self.registry.register(self._config)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ("model",), registry=self.registry).labels(model)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ("model",), registry=self.registry, buckets=buckets).labels(model)

        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
            return Gauge(name, doc, ("model", *labels), registry=self.registry)

        self.model = model
        self.num_drafts = counter("governor_spec_decode_num_drafts", "Sequence-steps that verified at least one "
                                  "draft token (vllm:spec_decode_num_drafts)")
        self.num_draft_tokens = counter("governor_spec_decode_num_draft_tokens", "Draft tokens proposed and "
                                        "verified (vllm:spec_decode_num_draft_tokens)")
        self.num_accepted_tokens = counter("governor_spec_decode_num_accepted_tokens", "Draft tokens accepted "
                                           "(vllm:spec_decode_num_accepted_tokens)")
        self.accepted_per_pos = self._array("governor_spec_decode_num_accepted_tokens_per_pos", "Draft tokens "
                                            "accepted at draft position (0-based) "
                                            "(vllm:spec_decode_num_accepted_tokens_per_pos)", "position")
        self.draft_tokens_per_pos = self._array("governor_spec_decode_num_draft_tokens_per_pos", "Draft tokens "
                                                "verified at draft position (0-based)", "position")
        self.shadow_drafts = counter("governor_shadow_lookup_drafts", "Drafts prompt lookup made in the shadow of "
                                     "plain decoding or of its own shorter k, over the tokens generated (nothing "
                                     "verified)")
        self.shadow_draft_tokens = counter("governor_shadow_lookup_draft_tokens", "Tokens those shadow drafts "
                                           "proposed")
        self.shadow_accepted_tokens = counter("governor_shadow_lookup_accepted_tokens", "Tokens of those shadow "
                                              "drafts that decoding then generated: what verification would have "
                                              "accepted")
        self.generation_tokens = counter("governor_generation_tokens", "Tokens delivered to clients "
                                         "(emitted)")
        self.prompt_tokens = counter("governor_prompt_tokens", "Prompt tokens prefilled")
        self.finished = counter("governor_requests_finished", "Requests finished")
        self.target_seconds = counter("governor_target_forward_seconds", "Seconds in target model forwards "
                                      "(verification and prefill)")
        self.draft_seconds = counter("governor_draft_forward_seconds", "Seconds in drafting")
        self.steps = histogram("governor_step_duration_seconds", "Engine step wall time; _count counts steps and "
                               "_sum their seconds", STEP_BUCKETS)
        self.ttft = histogram("governor_time_to_first_token_seconds", "Arrival to first token delivered",
                              TTFT_BUCKETS)
        self.itl = histogram("governor_inter_token_latency_seconds", "Gap between tokens delivered, spread evenly "
                             "over the tokens one step delivers", ITL_BUCKETS)
        self.e2e = histogram("governor_e2e_request_latency_seconds", "Arrival to the last token", E2E_BUCKETS)
        self.batch_size = gauge("governor_batch_size", "Sequences in the running batch now").labels(model)
        self.queue_depth = gauge("governor_queue_depth", "Requests waiting for admission now").labels(model)
        self.expert_tokens = self._array("governor_expert_tokens", "Tokens routed to each logical expert "
                                         "(top-k assignments, before any drop)", "layer", "expert")
        self.slot_tokens = self._array("governor_moe_slot_tokens", "Tokens computed by each physical expert slot",
                                       "layer", "slot")
        self.rank_tokens = self._array("governor_moe_rank_tokens", "Tokens computed on each expert-parallel rank",
                                       "layer", "rank")
        self.dropped_tokens = self._array("governor_moe_dropped_tokens", "Token assignments dropped over expert "
                                          "capacity", "layer")
        self.all_to_all_seconds = counter("governor_moe_all_to_all_seconds", "Seconds in expert-parallel "
                                          "all-to-all communication")
        self.balancedness = gauge("governor_moe_balancedness_ratio", "Balancedness of the last step: sum over "
                                  "layers of mean rank tokens / sum of max rank tokens (vLLM)")
        self.request_errors = Counter("governor_request_errors", "Requests answered with a 5xx or ended by an error "
                                      "event, by cause", ("model", "cause"), registry=self.registry)
        self.layer_balancedness = gauge("governor_moe_layer_balancedness_ratio", "Balancedness of the last step, "
                                        "per MoE layer: mean rank tokens / max rank tokens", ("layer",))

    def _array(self, name: str, doc: str, *labels: str) -> _ArrayCounter:
        counter = _ArrayCounter(name, doc, self.model, labels)
        self.registry.register(counter)
        return counter

    def watch_load(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        """Read batch size and queue depth when scraped, so they are current even while the engine idles."""
        self.batch_size.set_function(running)
        self.queue_depth.set_function(waiting)

    def request_failed(self, cause: str) -> None:
        self.request_errors.labels(self.model, cause).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- TelemetrySink ----------------------------------------------------------------------------

    def record_config(self, config: EngineConfig) -> None:
        self._config.config = config

    def record_step(self, step: StepRecord) -> None:
        """Batch size and queue depth are read when scraped (watch_load), not per step."""
        self.steps.observe(step.step_seconds)
        self.target_seconds.inc(step.target_seconds)
        self.draft_seconds.inc(step.draft_seconds)
        self.num_drafts.inc(step.num_drafts)
        self.num_draft_tokens.inc(sum(step.drafted_per_position))
        self.num_accepted_tokens.inc(sum(step.accepted_per_position))
        if step.drafted_per_position:
            self.draft_tokens_per_pos.add(step.drafted_per_position)
            self.accepted_per_pos.add(step.accepted_per_position)
        self.shadow_drafts.inc(step.shadow_lookups)
        self.shadow_draft_tokens.inc(sum(step.shadow_drafted_per_position))
        self.shadow_accepted_tokens.inc(sum(step.shadow_accepted_per_position))
        self.prompt_tokens.inc(step.prefill_tokens)
        for grid, counts in ((self.expert_tokens, step.expert_tokens), (self.slot_tokens, step.slot_tokens),
                             (self.rank_tokens, step.rank_tokens)):
            if counts is not None:
                grid.add(counts)
        if step.dropped_per_layer is not None:
            self.dropped_tokens.add(step.dropped_per_layer)
        self.all_to_all_seconds.inc(step.all_to_all_seconds)
        if step.balancedness is not None:
            self.balancedness.labels(self.model).set(step.balancedness)
        for layer, value in enumerate(step.balancedness_per_layer or ()):
            if value is not None:
                self.layer_balancedness.labels(self.model, str(layer)).set(value)

    def record_tokens(self, *, count: int, ttft: float | None, gap: float | None) -> None:
        self.generation_tokens.inc(count)
        if ttft is not None:
            self.ttft.observe(ttft)
        if gap is not None:
            for _ in range(count):
                self.itl.observe(gap / count)

    def record_finished(self, e2e: float) -> None:
        self.finished.inc()
        self.e2e.observe(e2e)


class _ArrayCounter(Collector):
    """Counters over bounded integer labels (position; layer and expert) kept as one array: an event adds its whole
    vector or grid at once, several times cheaper than a labelled child per cell."""

    def __init__(self, name: str, doc: str, model: str, labels: tuple[str, ...]):
        self.name, self.doc, self.model, self.labels = name, doc, model, labels
        self._lock = threading.Lock()
        self._total = np.zeros((0,) * len(labels))

    def add(self, counts) -> None:
        """counts: nested lists, a NumPy array or a tensor on any device."""
        counts = np.asarray(counts.tolist() if hasattr(counts, "tolist") else counts, dtype=np.float64)
        with self._lock:
            if counts.shape != self._total.shape:
                shape = np.maximum(counts.shape, self._total.shape)
                self._total = _pad(self._total, shape)
                counts = _pad(counts, shape)
            self._total += counts

    def collect(self) -> Iterable[CounterMetricFamily]:
        with self._lock:
            total = self._total.copy()
        family = CounterMetricFamily(self.name, self.doc, labels=["model", *self.labels])
        for index, value in np.ndenumerate(total):
            family.add_metric([self.model, *map(str, index)], value)
        yield family


def _pad(array: np.ndarray, shape) -> np.ndarray:
    return np.pad(array, [(0, n - m) for n, m in zip(shape, array.shape)])


class _ConfigInfo(Collector):
    """governor_config_info{model, version, spec_method, draft_len, ...} 1: the live EngineConfig as labels.

    Every scalar field becomes a label of its own name; draft_len_schedule reads "up_to:k,..." (e.g. "1:8,4:4,16:0");
    another structured one (e.g. placement) becomes a short digest, so labels stay bounded while a change remains
    visible.
    """

    def __init__(self, model: str):
        self.model = model
        self.config: EngineConfig | None = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = {"model": self.model}
        if self.config is not None:
            labels |= {name: _label_value(value) for name, value in self.config.model_dump().items()}
            labels["draft_len_schedule"] = schedule_label(self.config.draft_len_schedule)
        family = GaugeMetricFamily("governor_config_info", "The engine configuration in use; always 1",
                                   labels=list(labels))
        if self.config is not None:
            family.add_metric(list(labels.values()), 1)
        yield family


def schedule_label(schedule: tuple[tuple[int, int], ...] | None) -> str:
    return "None" if schedule is None else ",".join(f"{up_to}:{k}" for up_to, k in schedule)


def _label_value(value) -> str:
    if value is None or isinstance(value, (str, int, float, bool)):
        return str(value)
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]
