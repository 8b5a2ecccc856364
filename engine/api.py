"""The OpenAI-compatible HTTP API plus the engine's side of the seam (/admin/window, /admin/config)."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from engine.api_common import APIError, bearer_guard, install_error_handlers, invalid_body
from engine.api_schema import ChatCompletionRequest, CompletionRequest
from engine.engine import Emission, RequestError
from engine.metrics import CONTENT_TYPE, EngineMetrics
from engine.service import EngineService
from engine.tracing import traced_request
from seam import EngineConfig, Experiment

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


def create_app(service: EngineService, model_name: str, admin_token: str | None,
               default_max_tokens: int = 16, metrics: EngineMetrics | None = None,
               tracer: Tracer | None = None, admin_router: APIRouter | None = None) -> FastAPI:
    """metrics: serve them at /metrics; tracer: one span per request (None: tracing off, nothing is made).
    With admin_router (a controller's), that router owns /admin/* and /alerts; without it, the engine serves its
    own side of the seam (GET /admin/window, GET/PUT /admin/config) for a remote controller."""
    app = FastAPI(title="Governor", version="0.1.0")
    engine, tokenizer = service.engine, service.engine.tokenizer

    install_error_handlers(app)

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"model {name!r} does not exist; this server serves {model_name!r}", "model",
                           kind="not_found_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "governor"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        check_model(body.model)
        return await _serve(body, tokenizer.encode(body.prompt), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        check_model(body.model)
        prompt = tokenizer.render_chat([m.model_dump() for m in body.messages])
        return await _serve(body, tokenizer.encode(prompt), chat=True)

    if metrics is not None:
        @app.get("/metrics", response_class=Response)
        async def prometheus_metrics():
            return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    if admin_router is not None:
        app.include_router(admin_router)
    else:
        _add_engine_admin(app, engine, admin_token)

    async def _serve(body, prompt_ids: list[int], chat: bool):
        params = body.sampling_params(default_max_tokens)
        try:
            engine.check_request(prompt_ids, params)
        except RequestError as error:
            raise APIError(400, str(error), error.field) from error
        stream = service.generate(prompt_ids, params)
        reply = _Reply(model_name, chat)
        if tracer is not None:
            stream = traced_request(tracer, stream, chat=chat, model=model_name, response_id=reply.id, params=params,
                                    prompt_tokens=len(prompt_ids))
        if body.stream:
            return StreamingResponse(reply.sse(stream, body.include_usage), media_type="text/event-stream")
        return await reply.whole(stream)

    return app


def _add_engine_admin(app: FastAPI, engine, admin_token: str | None) -> None:
    @app.get("/admin/window")
    async def window():
        return engine.snapshot().to_dict()

    @app.get("/admin/config")
    async def get_config():
        return engine.config.model_dump()

    async def apply(request: Request, kind: type[EngineConfig] | type[Experiment]) -> dict:
        try:
            change = kind.model_validate_json(await request.body())
            engine.apply(change)
        except ValidationError as error:
            raise invalid_body(error) from error
        except RequestError as error:
            raise APIError(400, str(error), error.field) from error
        return change.model_dump()

    @app.put("/admin/config", dependencies=[Depends(bearer_guard(admin_token))])
    async def put_config(request: Request):
        """Take a config into use; ends a running experiment."""
        return await apply(request, EngineConfig)

    @app.put("/admin/experiment", dependencies=[Depends(bearer_guard(admin_token))])
    async def put_experiment(request: Request):
        """Alternate two configs in blocks of steps (a switchback trial) until the next PUT /admin/config."""
        return await apply(request, Experiment)


class _Reply:
    """Shapes emissions into OpenAI completion or chat.completion objects and chunks."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
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
            if last.text or last.finish_reason:
                delta = {"delta": {"content": last.text} if last.text else {}} if self.chat else {"text": last.text}
                yield self._event([{"index": 0, **delta, "finish_reason": last.finish_reason}])
        if include_usage and last is not None:
            yield f"data: {json.dumps({**self._envelope([], chunk=True), 'usage': self._usage(last)})}\n\n"
        yield "data: [DONE]\n\n"

    def _event(self, choices: list) -> str:
        return f"data: {json.dumps(self._envelope(choices, chunk=True))}\n\n"
