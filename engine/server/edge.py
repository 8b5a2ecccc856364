"""ASGI middleware at the edge, before any route reads a byte of the body: writes without the admin token get 401,
generation requests while the waiting queue is full get 429, a body over the size limit gets 413 as soon as its
Content-Length, or its streamed bytes, pass the limit, and a method a path does not take gets 405 naming those it
does."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.server.admission import Admission, Overloaded
from seam.http import GUARDED_PREFIXES, WRITE_METHODS, error_body, has_admin_token


def install_edge(app: Starlette, admission: Admission, admin_token: str | None, max_body_bytes: int,
                 generation_paths: frozenset[str], allowed: Callable[[], dict[str, set[str]]]) -> None:
    """Outermost first: the write guard, the admission gate, the body limit, then 405 naming every method."""
    app.add_middleware(MethodNotAllowed, allowed=allowed)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes,
                       on_refuse=lambda: admission.refusals.count("body_too_large"))
    app.add_middleware(AdmissionGate, admission=admission, paths=generation_paths)
    app.add_middleware(WriteGuard, admin_token=admin_token)


class WriteGuard:
    """401 for every state-changing request under /admin/ or to /alerts without the admin bearer token."""

    def __init__(self, app: ASGIApp, admin_token: str | None):
        self.app, self.admin_token = app, admin_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in WRITE_METHODS \
                and scope["path"].startswith(GUARDED_PREFIXES) \
                and not has_admin_token(_header(scope, b"authorization"), self.admin_token):
            response = JSONResponse(error_body("a valid bearer token (GOVERNOR_ADMIN_TOKEN) is required",
                                               "authentication_error"), status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def overloaded_response(error: Overloaded) -> JSONResponse:
    return JSONResponse(error_body(str(error), "rate_limit_error", code=error.reason), status_code=429,
                        headers={"Retry-After": str(error.retry_after_seconds)})


class AdmissionGate:
    """429 for a generation request while the waiting queue is full, before its body is read, held for the limits'
    refusal_delay_seconds first (a client that retries as soon as it is refused then asks at most once per delay):
    under overload the refusals cost next to nothing, so the server stays responsive for the requests it admitted."""

    def __init__(self, app: ASGIApp, admission: Admission, paths: frozenset[str]):
        self.app, self.admission, self.paths = app, admission, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            try:
                self.admission.refuse_if_full()
            except Overloaded as error:
                await asyncio.sleep(self.admission.limits.refusal_delay_seconds)
                await overloaded_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads a request body only up to max_bytes; past it, 413 and the connection is closed. on_refuse() counts it."""

    def __init__(self, app: ASGIApp, max_bytes: int, on_refuse: Callable[[], None] = lambda: None):
        self.app, self.max_bytes, self.on_refuse = app, max_bytes, on_refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break                           # the client left: the app sees the disconnect
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        await self.app(scope, _replay(message, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.on_refuse()
        response = JSONResponse(error_body(f"the request body exceeds {self.max_bytes} bytes (GOVERNOR_MAX_BODY_BYTES)",
                                           "invalid_request_error", "body"), status_code=413,
                                headers={"Connection": "close"})
        await response(scope, receive, send)


class MethodNotAllowed:
    """405 naming every method a path takes in `Allow` (Starlette names only its first route's when a path has a
    route per method). allowed() maps each path without parameters to its methods; it is read at the first request,
    once every route is in."""

    def __init__(self, app: ASGIApp, allowed: Callable[[], dict[str, set[str]]]):
        self.app, self.allowed, self._table = app, allowed, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self._table is None:
                self._table = self.allowed()
            methods = self._table.get(scope["path"])
            if methods is not None and scope["method"] not in methods:
                allow = ", ".join(sorted(methods))
                response = JSONResponse(error_body(f"{scope['method']} is not allowed here; allowed: {allow}",
                                                   "invalid_request_error"), status_code=405, headers={"Allow": allow})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _replay(first: Message, receive: Receive) -> Receive:
    """A receive that returns the body read already, then whatever the server sends next (e.g. a disconnect)."""
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()
    return replayed


def _header(scope: Scope, name: bytes) -> str:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key == name), "")
