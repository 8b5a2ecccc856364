"""The `governor` command line: serve, load, bench, plan, control, policy."""
from __future__ import annotations

import argparse
import contextlib
import sys
import threading

from pydantic import ValidationError

from engine.loadgen.cli import add_load_arguments, run_load
from engine.plan_cli import add_plan_arguments, run_plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="governor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the engine and its OpenAI-compatible API")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--model", help="shipped model name, model folder or .gguf file (default governor-moe)")
    serve.add_argument("--draft", help="draft model name or path, self:N, or none (default: the model's own)")
    serve.add_argument("--ep", type=int, help="expert-parallel ranks: processes that share the MoE experts "
                       "over torch.distributed (default 1: one process)")
    serve.add_argument("--redundant-experts", type=int,
                       help="spare expert slots for replicas, over all ranks (default 0)")
    serve.add_argument("--demo-traffic", action="store_true", default=None,
                       help="send the built-in demo load to this server, so the dashboard shows live data")
    serve.add_argument("--policy", help="controller policy YAML file or shipped policy name (default: default)")
    serve.add_argument("--db", help="SQLAlchemy URL of the controller's store (default sqlite:///governor.db)")
    serve.add_argument("--no-controller", dest="controller", action="store_false", default=None,
                       help="serve the engine alone, for a `governor control` elsewhere")
    serve.set_defaults(run=_serve)

    load = commands.add_parser("load", help="open-loop traffic generator")
    add_load_arguments(load)
    load.set_defaults(run=run_load)

    bench = commands.add_parser("bench", help="benchmarks that print figures and write JSON + PNG")
    benches = bench.add_subparsers(dest="bench", required=True)
    from engine.bench.spec import add_spec_arguments, run_spec_bench

    spec = benches.add_parser("spec", help="speculative decoding: k = 0..8, beside transformers")
    add_spec_arguments(spec)
    spec.set_defaults(run=run_spec_bench)
    from engine.bench.telemetry import add_telemetry_arguments, run_telemetry_bench

    telemetry = benches.add_parser("telemetry", help="tokens/s with Prometheus metrics and tracing on vs off")
    add_telemetry_arguments(telemetry)
    telemetry.set_defaults(run=run_telemetry_bench)

    from engine.bench.moe_parts import add_moe_bench_arguments, run_moe_bench_parts

    moe = benches.add_parser("moe", help="MoE: one process vs expert parallelism, capacity factors, placement; "
                                         "the planner beside DeepSeek EPLB's greedy")
    add_moe_bench_arguments(moe)
    moe.set_defaults(run=run_moe_bench_parts)

    from engine.bench.soak import add_soak_arguments, run_soak_bench

    soak = benches.add_parser("soak", help="N streaming and non-streaming clients for D minutes, half leaving early: "
                                           "errors, latency, RSS, KV blocks left")
    add_soak_arguments(soak)
    soak.set_defaults(run=run_soak_bench)
    from engine.bench.overload import add_overload_arguments, run_overload_bench

    overload = benches.add_parser("overload", help="many requests at once: 429s, 5xx, /health latency, admitted "
                                                   "requests' latency beside the SLO")
    add_overload_arguments(overload)
    overload.set_defaults(run=run_overload_bench)
    from controller.bench import add_controller_bench_arguments, run_controller_bench

    controller_bench = benches.add_parser("controller", help="the controller vs static configs and the per-phase "
                                                             "oracle on phase-shifting load")
    add_controller_bench_arguments(controller_bench)
    controller_bench.set_defaults(run=run_controller_bench)

    plan = commands.add_parser("plan", help="expert placement from measured heat, as JSON")
    add_plan_arguments(plan)
    plan.set_defaults(run=run_plan)

    from controller.cli import add_control_arguments, add_policy_arguments, run_control

    control = commands.add_parser("control", help="run the controller against remote engines")
    add_control_arguments(control)
    control.set_defaults(run=run_control)

    policy = commands.add_parser("policy", help="controller policy files")
    add_policy_arguments(policy)

    args = parser.parse_args(argv)
    return args.run(args)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dashboards.web import create_dashboard_router
    from engine.admission import Admission, AdmissionLimits
    from engine.api import create_app
    from engine.engine import EngineLimits
    from engine.ep import ExpertParallelError
    from engine.live import LiveTelemetry
    from engine.metrics import EngineMetrics
    from engine.models import build_engine, load_models
    from engine.service import EngineService
    from engine.serving_metrics import ServingLimitsCollector
    from engine.settings import Settings
    from engine.spec import ModelFolderError
    from engine.tracing import StepSpans, TracingConfigError, tracer_provider_from_env

    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        first = error.errors()[0]
        print(f"governor serve: --{str(first['loc'][0]).replace('_', '-')}: {first['msg']}", file=sys.stderr)
        return 2
    try:
        tracing = tracer_provider_from_env()
    except TracingConfigError as error:
        print(f"governor serve: {error}", file=sys.stderr)
        return 2
    policy = None
    if settings.controller:
        from policies import PolicyError, load_policy

        try:
            policy = load_policy(settings.policy)
        except PolicyError as error:
            print(f"governor serve: --policy: {error}", file=sys.stderr)
            return 2
    print(f"governor: loading {settings.model} ...", file=sys.stderr, flush=True)
    try:
        models = load_models(settings.model, settings.draft)
    except (ModelFolderError, ModuleNotFoundError) as error:
        print(f"governor serve: {error}", file=sys.stderr)
        return 2
    limits = EngineLimits(kv_cache_tokens=settings.kv_cache_tokens, max_num_seqs=settings.max_num_seqs,
                          max_batch_tokens=settings.max_batch_tokens)
    metrics, live = EngineMetrics(models.name), LiveTelemetry()
    tracer = tracing.get_tracer("governor") if tracing is not None else None
    try:
        engine = build_engine(models, limits=limits, ep=settings.ep, redundant_experts=settings.redundant_experts,
                              model=settings.model, sinks=[metrics, live, *([StepSpans(tracer)] if tracer else [])])
    except (ValueError, ExpertParallelError) as error:
        print(f"governor serve: {error}", file=sys.stderr)
        return 2
    metrics.watch_load(lambda: len(engine.scheduler.running), lambda: len(engine.scheduler.waiting))
    service = EngineService(engine, admission=Admission(AdmissionLimits(
        settings.max_waiting_requests, settings.max_waiting_tokens, settings.retry_after_seconds)))
    metrics.registry.register(ServingLimitsCollector(models.name, service.admission, engine.allocator, {
        "max_body_bytes": settings.max_body_bytes, "max_prompt_chars": settings.max_prompt_chars,
        "max_sse_clients": settings.max_sse_clients, "max_num_seqs": settings.max_num_seqs}))
    plane = None
    if policy is not None:
        from controller.cli import build_control_plane, print_decision
        from controller.clients import InProcessClient
        from controller.metrics import PrometheusCounters
        from controller.store import StoreError

        try:
            plane = build_control_plane(InProcessClient(engine), policy, settings.db, settings.admin_token,
                                        policy_name=settings.policy, on_decision=print_decision,
                                        metrics=PrometheusCounters(metrics.registry, models.name),
                                        retention_days=settings.retention_days)
        except StoreError as error:
            engine.close()
            print(f"governor serve: --db: {error}", file=sys.stderr)
            return 2
    app = create_app(service, models.name, settings.admin_token, settings.default_max_tokens, metrics, tracer,
                     admin_router=plane.router if plane else None, max_body_bytes=settings.max_body_bytes,
                     max_prompt_chars=settings.max_prompt_chars)
    app.include_router(create_dashboard_router(live, lambda: engine.config, plane.controller if plane else None,
                                               max_clients=settings.max_sse_clients,
                                               on_refuse=lambda: service.admission.refusals.count("sse_clients")))
    stop_demo = threading.Event()

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        service.start()
        if plane:
            plane.start()
        if settings.demo_traffic:
            _start_demo_traffic(f"http://{settings.host}:{settings.port}", stop_demo)
        yield
        stop_demo.set()
        if plane:
            plane.stop()
        service.stop()
        engine.close()
        if tracing is not None:
            tracing.shutdown()

    app.router.lifespan_context = lifespan
    # an open dashboard holds an endless event stream: cut it after a short grace instead of waiting for the tab
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=3)
    return 0


def _start_demo_traffic(url: str, stop: threading.Event) -> None:
    from engine.loadgen import load_phases, run_forever

    threading.Thread(target=run_forever, args=(url, load_phases(), stop),
                     name="governor-demo-traffic", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
