"""OpenTelemetry: request spans with the GenAI attributes, sampled step spans, and the OTEL_* environment."""
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from engine.engine import Engine
from engine.factory import build_engine
from engine.runtime.limits import EngineLimits
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from engine.server.tracing import StepSpans, TracingConfigError, tracer_provider_from_env
from seam import EngineConfig
from tests.engine.helpers import code_prompts, generate

MODEL = "governor-moe"
OTEL_VARIABLES = ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
                  "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME")


@pytest.fixture
def clean_otel_env(monkeypatch):
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def exporter():
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


@pytest.fixture
def server(moe_models, tracer):
    service = EngineService(build_engine(moe_models, EngineConfig(draft_len=3)))
    with serving_in_thread(create_app(service, MODEL, "token", tracer=tracer), service) as url:
        yield url


def test_a_completion_is_one_span_with_the_genai_attributes(server, exporter):
    reply = httpx.post(f"{server}/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": "def add(a, b):\n", "max_tokens": 10, "temperature": 0.5, "top_p": 0.9,
        "seed": 7, "stop": ["\n\n\n"], "ignore_eos": True}).json()
    [span] = exporter.get_finished_spans()
    assert span.name == f"text_completion {MODEL}"
    assert span.kind == SpanKind.SERVER
    assert dict(span.attributes) == {
        "gen_ai.operation.name": "text_completion", "gen_ai.provider.name": "governor",
        "gen_ai.request.model": MODEL, "gen_ai.request.max_tokens": 10, "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 0.9, "gen_ai.request.seed": 7, "gen_ai.request.stop_sequences": ("\n\n\n",),
        "gen_ai.response.model": MODEL, "gen_ai.response.id": reply["id"],
        "gen_ai.usage.input_tokens": reply["usage"]["prompt_tokens"],
        "gen_ai.usage.output_tokens": reply["usage"]["completion_tokens"],
        "gen_ai.response.finish_reasons": ("length",)}
    assert [event.name for event in span.events] == ["gen_ai.first_token"]
    assert span.start_time <= span.events[0].timestamp <= span.end_time


def test_a_streamed_chat_span_ends_when_the_stream_does(server, exporter):
    with httpx.stream("POST", f"{server}/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True,
            "ignore_eos": True}) as response:
        chunks = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]"
    [span] = exporter.get_finished_spans()
    assert span.name == f"chat {MODEL}"
    assert span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["gen_ai.usage.output_tokens"] == 6
    assert span.attributes["gen_ai.response.finish_reasons"] == ("length",)


def test_every_nth_engine_step_is_a_span_timed_as_the_step(moe_models, tracer, exporter):
    sink = StepSpans(tracer, every=2)
    engine = Engine(moe_models.target, moe_models.tokenizer, moe_models.draft, EngineConfig(version=4, draft_len=3),
                    EngineLimits(kv_cache_tokens=8192), sinks=[sink])
    generate(engine, code_prompts(moe_models.tokenizer, 2, max_bytes=60))
    window = engine.snapshot()
    spans = exporter.get_finished_spans()
    assert window.steps >= 4
    assert len(spans) == window.steps // 2
    assert [s.attributes["governor.step.number"] for s in spans] == list(range(2, window.steps + 1, 2))
    for span in spans:
        assert span.name == "engine step"
        assert span.attributes["governor.config.version"] == 4
        forwards = span.attributes["governor.step.target_forward_seconds"] + span.attributes[
            "governor.step.draft_forward_seconds"]
        assert span.end_time - span.start_time >= int(forwards * 1e9)
    assert sum(s.attributes["governor.step.accepted_tokens"] for s in spans) <= window.accepted_tokens


def test_tracing_is_off_by_default_and_loads_no_opentelemetry_sdk():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    script = ("import sys, engine.server.api, governor.cli\n"
              "from engine.server.tracing import tracer_provider_from_env\n"
              "assert tracer_provider_from_env() is None\n"
              "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("variables", [{"OTEL_TRACES_EXPORTER": "none"},
                                       {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}])
def test_tracing_stays_off_when_the_environment_says_so(clean_otel_env, variables):
    for name, value in variables.items():
        clean_otel_env.setenv(name, value)
    assert tracer_provider_from_env() is None


@pytest.mark.parametrize(("variables", "named"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin_json"}, "OTEL_TRACES_EXPORTER: exporter 'zipkin_json' is not installed"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "pigeon"},
     "OTEL_EXPORTER_OTLP_PROTOCOL: 'pigeon'"),
])
def test_an_unusable_exporter_setting_is_refused_naming_it(clean_otel_env, variables, named):
    for name, value in variables.items():
        clean_otel_env.setenv(name, value)
    with pytest.raises(TracingConfigError, match=named):
        tracer_provider_from_env()


def test_serve_refuses_an_unknown_exporter_before_loading_the_model():
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, "OTEL_TRACES_EXPORTER": "jaeger"}
    result = subprocess.run([sys.executable, "-m", "governor.cli", "serve", "--port", "1"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "OTEL_TRACES_EXPORTER" in result.stderr and "'jaeger'" in result.stderr
    assert "loading" not in result.stderr


def test_otlp_exporter_sends_spans_to_the_endpoint_the_environment_names(clean_otel_env):
    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        clean_otel_env.setenv("OTEL_TRACES_EXPORTER", "otlp")
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_address[1]}")
        provider = tracer_provider_from_env()
        provider.get_tracer("test").start_span("probe", attributes={"gen_ai.request.model": MODEL}).end()
        provider.shutdown()
    finally:
        collector.shutdown()
        collector.server_close()
        thread.join(timeout=10)
    [(path, body)] = received
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    [span] = resource_spans.scope_spans[0].spans
    assert (service, span.name) == ("governor", "probe")
