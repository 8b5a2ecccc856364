"""OpenTelemetry traces: one span per request with the gen_ai.* attributes, and a sampled span per engine step.

Off unless OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`, or any installed exporter's entry point);
the SDK then reads the other standard variables itself (OTEL_EXPORTER_OTLP_*, OTEL_TRACES_SAMPLER,
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*). While off, nothing here is called or created.
"""
from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from engine.runtime.delivery import Emission
from engine.telemetry.recorder import StepRecord
from seam import EngineConfig, SamplingParams

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

EXPORTER_GROUP = "opentelemetry_traces_exporter"
OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
STEPS_PER_SPAN = 100


class TracingConfigError(ValueError):
    """The OTEL_* environment names an exporter that is not installed or a protocol that is not known."""


def tracer_provider_from_env() -> TracerProvider | None:
    """A TracerProvider exporting as the OTEL_* environment says, or None when tracing is off (the default)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    names = [n for n in names if n and n != "none"]
    if not names:
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_exporter_class(name)() for name in names]
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "governor"}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter_class(name: str) -> type:
    if name == "otlp":
        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
        if protocol not in OTLP_BY_PROTOCOL:
            raise TracingConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not one of "
                                     f"{', '.join(OTLP_BY_PROTOCOL)}")
        name = OTLP_BY_PROTOCOL[protocol]
    found = entry_points(group=EXPORTER_GROUP, name=name)
    if not found:
        installed = sorted(ep.name for ep in entry_points(group=EXPORTER_GROUP))
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER: exporter {name!r} is not installed (installed: "
                                 f"{', '.join(['otlp', *installed, 'none'])})")
    return next(iter(found)).load()


async def traced_request(tracer: Tracer, stream: AsyncIterator[Emission], *, chat: bool, model: str,
                         response_id: str, params: SamplingParams, prompt_tokens: int) -> AsyncIterator[Emission]:
    """Pass a request's emissions through, inside one span named as the GenAI conventions say."""
    from opentelemetry.trace import SpanKind, Status, StatusCode

    operation = "chat" if chat else "text_completion"
    attributes = {
        "gen_ai.operation.name": operation, "gen_ai.provider.name": "governor", "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": params.max_tokens, "gen_ai.request.temperature": params.temperature,
        "gen_ai.request.top_p": params.top_p, "gen_ai.response.model": model, "gen_ai.response.id": response_id,
        "gen_ai.usage.input_tokens": prompt_tokens,
    }
    if params.seed is not None:
        attributes["gen_ai.request.seed"] = params.seed
    if params.stop:
        attributes["gen_ai.request.stop_sequences"] = list(params.stop)
    span = tracer.start_span(f"{operation} {model}", kind=SpanKind.SERVER, attributes=attributes)
    last, first_token_seen = None, False
    try:
        async for last in stream:
            if last.output_tokens and not first_token_seen:
                span.add_event("gen_ai.first_token")
                first_token_seen = True
            yield last
    except Exception as error:
        span.set_status(Status(StatusCode.ERROR, str(error)))
        span.set_attribute("error.type", type(error).__qualname__)
        raise
    finally:
        if last is not None:
            span.set_attribute("gen_ai.usage.output_tokens", last.output_tokens)
            if last.finish_reason is not None:
                span.set_attribute("gen_ai.response.finish_reasons", [last.finish_reason])
        span.end()


class StepSpans:
    """A TelemetrySink that turns every `every`-th engine step into a span (steps are too many to trace all)."""

    def __init__(self, tracer: Tracer, every: int = STEPS_PER_SPAN):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.tracer, self.every = tracer, every
        self._steps = 0
        self._config_version = 0

    def record_config(self, config: EngineConfig) -> None:
        self._config_version = config.version

    def record_step(self, step: StepRecord) -> None:
        self._steps += 1
        if self._steps % self.every:
            return
        end = time.time_ns()
        span = self.tracer.start_span("engine step", start_time=end - int(step.step_seconds * 1e9), attributes={
            "governor.step.number": self._steps, "governor.step.batch_size": step.batch_size,
            "governor.step.queue_depth": step.queue_depth, "governor.step.prefill_tokens": step.prefill_tokens,
            "governor.step.num_drafts": step.num_drafts, "governor.step.draft_tokens": sum(step.drafted_per_position),
            "governor.step.accepted_tokens": sum(step.accepted_per_position),
            "governor.step.target_forward_seconds": step.target_seconds,
            "governor.step.draft_forward_seconds": step.draft_seconds, "governor.config.version": self._config_version})
        span.end(end_time=end)

    def record_tokens(self, *, count: int, ttft: float | None, gap: float | None) -> None:
        pass

    def record_finished(self, e2e: float) -> None:
        pass
