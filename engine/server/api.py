"""The OpenAI-compatible HTTP API plus the engine's side of the seam (/admin/window, /admin/config)."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from engine.engine import RequestError
from engine.model.tokenizer import ChatTemplateError
from engine.runtime.delivery import Emission, Failure
from engine.server.abandon import whole_unless_abandoned
from engine.server.admission import Overloaded
from engine.server.api_schema import served_requests
from engine.server.edge import install_edge
from engine.server.health import Health, UpCollector
from engine.server.service import RETRY_AFTER_SECONDS, EngineService, Unavailable
from engine.server.tracing import traced_request
from engine.telemetry.metrics import CONTENT_TYPE, EngineMetrics
from seam import EngineConfig, Experiment
from seam.http import APIError, FiniteJSONResponse, bearer_guard, install_error_handlers, invalid_body
from seam.openapi import ERRORS, HEALTH, allowed_methods, error, exact_openapi, json_body

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

READER_PATTERN = r"^[A-Za-z0-9_.-]{1,32}$"
CONTROLLER_READER = "controller"
GENERATION_ERRORS = {**ERRORS, 404: error("the model is not the one this server serves"),
                     429: error("overloaded: too many requests or prompt tokens waiting; see Retry-After"),
                     500: error("the engine failed this request; error.code names the cause"),
                     503: error("the engine cannot take requests now, or failed this one and recovers by itself; "
                                "see Retry-After")}

STREAMING = {200: {"description": "the completion; with stream=true, server-sent events",
                   "content": {"application/json": {}, "text/event-stream": {}}}}


def _server_error(failure: Failure) -> APIError:
    """A request the engine failed: 503 if the service recovers by itself (retry), else 500."""
    status, headers = (503, {"Retry-After": str(RETRY_AFTER_SECONDS)}) if failure.retryable else (500, None)
    return APIError(status, f"the engine failed this request: {failure.message}", kind="server_error",
                    code=failure.cause, headers=headers)


def _unavailable_error(refusal: Unavailable) -> APIError:
    headers = {"Retry-After": str(refusal.retry_after)} if refusal.retry_after is not None else None
    return APIError(503, f"the engine cannot take requests now: {refusal}", kind="server_error",
                    code="engine_unavailable", headers=headers)


GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_PROMPT_CHARS = 1 << 17


def create_app(service: EngineService, model_name: str, admin_token: str | None,
               default_max_tokens: int = 16, metrics: EngineMetrics | None = None,
               tracer: Tracer | None = None, admin_router: APIRouter | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
               health: Health | None = None) -> FastAPI:
    """metrics: serve them at /metrics; tracer: one span per request (None: tracing off, nothing is made).
    With admin_router (a controller's), that router owns /admin/* and /alerts; without it, the engine serves its
    own side of the seam (GET /admin/window, GET/PUT /admin/config, POST /admin/config/check) for a remote
    controller. A body over max_bytes gets 413 unread; a prompt over max_prompt_chars characters gets 400
    untokenized. health: the components beside the engine (controller, store) whose faults /health and /ready
    report."""
    app = FastAPI(title="Governor", version="0.1.0", default_response_class=FiniteJSONResponse)
    engine, tokenizer = service.engine, service.engine.tokenizer
    refusals = service.admission.refusals
    install_edge(app, service.admission, admin_token, max_body_bytes, GENERATION_PATHS, lambda: allowed_methods(app))
    app.openapi = exact_openapi(app)
    CompletionRequest, ChatCompletionRequest = served_requests(model_name, max_prompt_chars, engine.max_model_len)
    health = health or Health()
    health.add("engine", service.fault)
    if engine.ep is not None:
        health.add("expert_parallel", service.group_fault)
    if metrics is not None:
        metrics.registry.register(UpCollector(health, model_name))

    install_error_handlers(app, lambda: refusals.count("prompt_too_long"))

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"model {name!r} does not exist; this server serves {model_name!r}", "model",
                           kind="not_found_error")

    def health_reply(problems: dict[str, str]):
        if problems:
            return JSONResponse(status_code=503, content={"status": "unavailable", "model": model_name,
                                                          "reasons": problems})
        return {"status": "ok", "model": model_name}

    @app.get("/health", responses=HEALTH)
    def liveness():
        """503 with the reasons while any component is down (a dead engine thread or rank, a stalled engine, a
        dead controller thread, a store that cannot be written). Not async: a probe may wait on the store."""
        return health_reply(health.problems())

    @app.get("/ready", responses=HEALTH)
    def readiness():
        """As /health, and 503 while new requests would be refused (e.g. during a respawn)."""
        problems = health.problems()
        refusal = service.unavailable()
        if refusal is not None:
            problems.setdefault("engine", str(refusal))
        return health_reply(problems)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "governor"}]}

    def check_prompt(body, field: str) -> None:
        check_model(body.model)
        if body.prompt_chars > max_prompt_chars:
            refusals.count("prompt_too_long")
            raise APIError(400, f"{field}: {body.prompt_chars} characters in all, at most {max_prompt_chars} are "
                           "served (GOVERNOR_MAX_PROMPT_CHARS)", field)

    def render_and_encode(messages: list[dict]) -> list[int]:
        try:
            return tokenizer.encode(tokenizer.render_chat(messages))
        except ChatTemplateError as error:
            raise APIError(400, f"messages: the model's chat template refused them: {error}", "messages") from error

    async def completions(body, request: Request):
        check_prompt(body, "prompt")
        return await _serve(request, body, await asyncio.to_thread(tokenizer.encode, body.prompt), chat=False)

    async def chat_completions(body, request: Request):
        check_prompt(body, "messages")
        prompt_ids = await asyncio.to_thread(render_and_encode, [m.model_dump() for m in body.messages])
        return await _serve(request, body, prompt_ids, chat=True)

    # the bodies' classes are made per app (they carry its bounds), so they are annotated here, not by name
    for path, endpoint, body_class in (("/v1/completions", completions, CompletionRequest),
                                       ("/v1/chat/completions", chat_completions, ChatCompletionRequest)):
        endpoint.__annotations__["body"] = body_class
        app.post(path, responses={**GENERATION_ERRORS, **STREAMING})(endpoint)

    if metrics is not None:
        @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
        async def prometheus_metrics():
            return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    if admin_router is not None:
        app.include_router(admin_router)
    else:
        _add_engine_admin(app, engine, admin_token)

    def count_failure(cause: str) -> None:
        if metrics is not None:
            metrics.request_failed(cause)

    async def _serve(request: Request, body, prompt_ids: list[int], chat: bool):
        params = body.sampling_params(default_max_tokens)
        try:
            submission = service.submit(prompt_ids, params)
        except RequestError as error:
            raise APIError(400, str(error), error.field) from error
        except Overloaded as error:
            raise APIError(429, str(error), kind="rate_limit_error", code=error.reason,
                           headers={"Retry-After": str(error.retry_after_seconds)}) from error
        except Unavailable as refusal:
            count_failure("engine_unavailable")
            raise _unavailable_error(refusal) from refusal
        stream = submission.emissions()
        reply = _Reply(model_name, chat, count_failure)
        if tracer is not None:
            stream = traced_request(tracer, stream, chat=chat, model=model_name, response_id=reply.id, params=params,
                                    prompt_tokens=len(prompt_ids))
        if body.stream:
            return StreamingResponse(reply.sse(stream, body.include_usage), media_type="text/event-stream")
        return await whole_unless_abandoned(request, reply.whole(stream), submission)

    return app


def _add_engine_admin(app: FastAPI, engine, admin_token: str | None) -> None:
    closed: dict[str, dict] = {}      # the latest window closed for the controller reader

    @app.get("/admin/window", responses={404: error("no controller has closed a window yet (without reader)")})
    async def window(reader: str | None = Query(None, pattern=READER_PATTERN)):
        """With reader: close that reader's window and return it (each reader has its own; `controller` is the
        remote controller's). Without: the controller's latest closed window, read without changing anything."""
        if reader is None:
            if "latest" not in closed:
                raise APIError(404, "no controller has closed a window yet", kind="not_found_error")
            return closed["latest"]
        data = engine.snapshot(reader).to_dict()
        if reader == CONTROLLER_READER:
            closed["latest"] = data
        return data

    @app.get("/admin/config")
    async def get_config():
        return engine.desired_config.model_dump()

    @app.post("/admin/config/check", dependencies=[Depends(bearer_guard(admin_token))],
              openapi_extra=json_body(EngineConfig), responses=ERRORS)
    async def check_config(request: Request):
        """Validate a config against this engine without applying it (a controller checks before it writes)."""
        return await engine_takes(request, EngineConfig, engine.check)

    async def apply(request: Request, kind: type[EngineConfig] | type[Experiment]) -> dict:
        return await engine_takes(request, kind, engine.apply)

    async def engine_takes(request: Request, kind: type[EngineConfig] | type[Experiment], act) -> dict:
        """The body parsed as kind, then act(change); a change the engine refuses is a 400 naming the field."""
        change = _parsed(await request.body(), kind)
        try:
            act(change)
        except RequestError as error:
            raise APIError(400, str(error), error.field) from error
        return change.model_dump()

    @app.put("/admin/config", dependencies=[Depends(bearer_guard(admin_token))], openapi_extra=json_body(EngineConfig),
             responses=ERRORS)
    async def put_config(request: Request):
        """Take a config into use; ends a running experiment."""
        return await apply(request, EngineConfig)

    @app.put("/admin/experiment", dependencies=[Depends(bearer_guard(admin_token))],
             openapi_extra=json_body(Experiment), responses=ERRORS)
    async def put_experiment(request: Request):
        """Alternate two configs in blocks of steps (a switchback trial) until the next PUT /admin/config."""
        return await apply(request, Experiment)


def _parsed(body: bytes, kind: type[EngineConfig] | type[Experiment]) -> EngineConfig | Experiment:
    try:
        return kind.model_validate_json(body, strict=True)
    except ValidationError as error:
        raise invalid_body(error) from error


class _Reply:
    """Shapes emissions into OpenAI completion or chat.completion objects and chunks."""

    def __init__(self, model: str, chat: bool, count_failure):
        self.model, self.chat, self._count_failure = model, chat, count_failure
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, choices: list, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    @staticmethod
    def _usage(emission: Emission) -> dict:
        return {"prompt_tokens": emission.prompt_tokens, "completion_tokens": emission.output_tokens,
                "total_tokens": emission.prompt_tokens + emission.output_tokens}

    async def whole(self, stream: AsyncIterator[Emission]) -> dict:
        text, last = [], None
        async for last in stream:
            if last.failure is not None:
                self._count_failure(last.failure.cause)
                raise _server_error(last.failure)
            text.append(last.text)
        content = "".join(text)
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if self.chat
                  else {"index": 0, "text": content, "logprobs": None})
        choice["finish_reason"] = last.finish_reason
        return {**self._envelope([choice], chunk=False), "usage": self._usage(last)}

    async def sse(self, stream: AsyncIterator[Emission], include_usage: bool) -> AsyncIterator[str]:
        if self.chat:
            yield self._event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        last = None
        async for last in stream:
            if last.failure is not None:
                self._count_failure(last.failure.cause)
                yield f"data: {json.dumps(_server_error(last.failure).body())}\n\n"
                return      # no [DONE]: the stream ends on the error
            if last.text or last.finish_reason:
                delta = {"delta": {"content": last.text} if last.text else {}} if self.chat else {"text": last.text}
                yield self._event([{"index": 0, **delta, "finish_reason": last.finish_reason}])
        if include_usage and last is not None:
            yield f"data: {json.dumps({**self._envelope([], chunk=True), 'usage': self._usage(last)})}\n\n"
        yield "data: [DONE]\n\n"

    def _event(self, choices: list) -> str:
        return f"data: {json.dumps(self._envelope(choices, chunk=True))}\n\n"
