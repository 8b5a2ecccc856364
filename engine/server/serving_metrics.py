"""/metrics for the serving limits: each bound as a gauge, how full it is, what each limit refused, and KV blocks in
use; read when scraped, from the objects that enforce them."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.model.kv_cache import BlockAllocator
from engine.server.admission import Admission


class ServingLimitsCollector(Collector):
    def __init__(self, model: str, admission: Admission, allocator: BlockAllocator, limits: dict[str, int]):
        """limits: name -> bound (e.g. max_body_bytes), exported with the admission bounds."""
        self.model, self.admission, self.allocator, self.limits = model, admission, allocator, limits

    def collect(self) -> Iterator[Metric]:
        admission, bounds = self.admission, dict(self.limits)
        for name, value in (("max_waiting_requests", admission.request_bound()),
                            ("max_waiting_tokens", admission.limits.max_waiting_tokens)):
            if value is not None:
                bounds[name] = value
        limit = GaugeMetricFamily("governor_limit", "Serving limits in force (GOVERNOR_<LIMIT>; max_waiting_requests as lowered by max_waiting_seconds)",
                                  labels=["model", "limit"])
        for name, value in sorted(bounds.items()):
            limit.add_metric([self.model, name], value)
        yield limit
        yield _gauge("governor_waiting_requests", "Requests admitted and not yet started (first token)",
                     self.model, admission.waiting_requests)
        yield _gauge("governor_waiting_prompt_tokens", "Prompt tokens of the requests waiting", self.model,
                     admission.waiting_tokens)
        refused = CounterMetricFamily("governor_requests_refused", "Requests refused by a limit, by reason "
                                      "(requests_waiting, tokens_waiting, body_too_large, prompt_too_long, "
                                      "sse_clients)", labels=["model", "reason"])
        for reason, count in sorted(admission.refusals.counts.items()):
            refused.add_metric([self.model, reason], count)
        yield refused
        yield _gauge("governor_kv_blocks_in_use", "KV cache blocks held by requests", self.model,
                     self.allocator.num_blocks - self.allocator.num_free)
        yield _gauge("governor_kv_blocks", "KV cache blocks in all", self.model, self.allocator.num_blocks)


def _gauge(name: str, doc: str, model: str, value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=["model"])
    gauge.add_metric([model], value)
    return gauge
