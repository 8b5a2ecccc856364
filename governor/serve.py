"""`governor serve`: engine, controller, API and dashboard in one process group, wired from Settings."""
from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from controller.clients import InProcessClient
from controller.counters import PrometheusCounters
from controller.plane import ControlPlane, build_control_plane, print_decision
from controller.store import StoreError
from dashboards.operator_page import create_dashboard_router
from engine.factory import build_engine
from engine.model.model_spec import ModelFolderError
from engine.moe.ep import ExpertParallelError
from engine.moe.ep_channel import RankLaunchError
from engine.respawn import expert_parallel_recovery, torchrun_recovery
from engine.server.admission import Admission, AdmissionLimits
from engine.server.api import create_app
from engine.server.health import Health
from engine.server.service import EngineService
from engine.server.serving_metrics import ServingLimitsCollector
from engine.server.tracing import StepSpans, TracingConfigError, tracer_provider_from_env
from engine.telemetry.live import LiveTelemetry
from engine.telemetry.metrics import EngineMetrics
from governor.control_cli import policy_or_none
from governor.ep_launch import run_worker, torchrun_member
from governor.loaders import load_models
from governor.loadgen import load_phases, run_forever
from governor.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

DEFAULTS = {name: field.default for name, field in Settings.model_fields.items()}


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """Flags default to None so that only the ones given override Settings (environment, then defaults)."""
    serve.add_argument("--host", help=f"bind address (default {DEFAULTS['host']})")
    serve.add_argument("--port", type=int, help=f"port (default {DEFAULTS['port']})")
    serve.add_argument("--model", help=f"shipped model name, model folder or .gguf file (default {DEFAULTS['model']})")
    serve.add_argument("--draft", help="draft model name or path, self:N, or none (default: the model's own)")
    serve.add_argument("--ep", type=int, help="expert-parallel ranks on this machine: processes that share the MoE "
                       f"experts over torch.distributed (default {DEFAULTS['ep']}: one process; under torchrun, "
                       "its ranks, on any nodes)")
    serve.add_argument("--redundant-experts", type=int,
                       help="spare expert slots for replicas, over all ranks "
                            f"(default {DEFAULTS['redundant_experts']})")
    serve.add_argument("--demo-traffic", action="store_true", default=None,
                       help="send the built-in demo load to this server, so the dashboard shows live data")
    serve.add_argument("--policy",
                       help=f"controller policy YAML file or shipped policy name (default: {DEFAULTS['policy']})")
    serve.add_argument("--db", help=f"SQLAlchemy URL of the controller's store (default {DEFAULTS['db']})")
    serve.add_argument("--no-controller", dest="controller", action="store_false", default=None,
                       help="serve the engine alone, for a `governor control` elsewhere")


def run_serve(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        first = error.errors()[0]
        print(f"governor serve: --{str(first['loc'][0]).replace('_', '-')}: {first['msg']}", file=sys.stderr)
        return 2
    try:
        member = torchrun_member(settings.ep)
    except RankLaunchError as error:
        print(f"governor serve: {error}", file=sys.stderr)
        return 2
    if member is not None and member.rank != 0:
        return run_worker(member)
    ranks = member.world if member is not None else settings.ep
    try:
        tracing = tracer_provider_from_env()
    except TracingConfigError as error:
        print(f"governor serve: {error}", file=sys.stderr)
        return 2
    policy = policy_or_none(settings.policy, "governor serve: --policy") if settings.controller else None
    if settings.controller and policy is None:
        return 2
    print(f"governor: loading {settings.model} ...", file=sys.stderr, flush=True)
    try:
        models = load_models(settings.model, settings.draft)
    except (ModelFolderError, ModuleNotFoundError) as error:
        print(f"governor serve: {error}", file=sys.stderr)
        return 2
    metrics, live = EngineMetrics(models.name), LiveTelemetry()
    tracer = tracing.get_tracer("governor") if tracing is not None else None
    try:
        engine = build_engine(models, limits=settings.limits(), ep=ranks, member=member,
                              redundant_experts=settings.redundant_experts,
                              sinks=[metrics, live, *([StepSpans(tracer)] if tracer else [])])
    except (ValueError, ExpertParallelError) as error:
        print(f"governor serve: {error}", file=sys.stderr)
        return 2
    metrics.watch_load(lambda: len(engine.scheduler.running), lambda: len(engine.scheduler.waiting))
    if engine.ep is None:
        recovery = None
    elif member is not None:
        recovery = torchrun_recovery(engine)
    else:
        recovery = expert_parallel_recovery(engine, models.target_loader, settings.ep, settings.limits(),
                                            settings.redundant_experts)
    admission = Admission(AdmissionLimits(settings.max_waiting_requests, settings.max_waiting_tokens,
                                          settings.retry_after_seconds, settings.max_waiting_seconds,
                                          settings.refusal_delay_seconds))
    # a service that gives up stops the server, which then exits non-zero (server is bound below, before any start)
    service = EngineService(engine, admission=admission, recovery=recovery,
                            on_fatal=lambda _: setattr(server, "should_exit", True))
    metrics.registry.register(ServingLimitsCollector(models.name, service.admission, engine.allocator, {
        "max_body_bytes": settings.max_body_bytes, "max_prompt_chars": settings.max_prompt_chars,
        "max_sse_clients": settings.max_sse_clients, "max_connections": settings.max_connections,
        "max_num_seqs": settings.max_num_seqs}))
    health = Health()
    plane = None
    if policy is not None:
        try:
            plane = build_control_plane(InProcessClient(engine), policy, settings.db, settings.admin_token,
                                        policy_name=settings.policy, on_decision=print_decision,
                                        metrics=PrometheusCounters(metrics.registry, models.name),
                                        retention_days=settings.retention_days)
        except StoreError as error:
            engine.close()
            print(f"governor serve: --db: {error}", file=sys.stderr)
            return 2
        health.add("controller", plane.controller.fault)
        health.add("store", plane.controller.store.fault)
    app = served_app(service, models.name, settings, metrics, live, plane, tracer, health)
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
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                           timeout_graceful_shutdown=3, limit_concurrency=settings.max_connections))
    gc.freeze()     # the models and modules loaded so far live forever: full collections need not scan them again
    with contextlib.suppress(KeyboardInterrupt):    # uvicorn re-raises the Ctrl-C it shut down on, as uvicorn.run
        server.run()
    if not server.started:
        print(f"governor serve: the HTTP server did not start on {settings.host}:{settings.port}", file=sys.stderr)
        return 1
    if service.fatal is not None:
        print(f"governor serve: {service.fatal}", file=sys.stderr)
        return 1
    return 0


def served_app(service: EngineService, model_name: str, settings: Settings, metrics: EngineMetrics,
               live: LiveTelemetry, plane: ControlPlane | None, tracer: Tracer | None = None,
               health: Health | None = None) -> FastAPI:
    """The app `governor serve` serves: the engine's API, the controller's admin router when a controller runs
    (plane), and the operator dashboard."""
    engine = service.engine
    app = create_app(service, model_name, settings.admin_token, settings.default_max_tokens, metrics, tracer,
                     admin_router=plane.router if plane else None, health=health,
                     max_body_bytes=settings.max_body_bytes, max_prompt_chars=settings.max_prompt_chars)
    app.include_router(create_dashboard_router(live, lambda: engine.config, plane.controller if plane else None,
                                               max_clients=settings.max_sse_clients,
                                               on_refuse=lambda: service.admission.refusals.count("sse_clients")))
    return app


def _start_demo_traffic(url: str, stop: threading.Event) -> None:
    threading.Thread(target=run_forever, args=(url, load_phases(), stop),
                     name="governor-demo-traffic", daemon=True).start()
