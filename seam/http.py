"""What every HTTP app of the service shares, the engine's and the controller's alike: OpenAI-style error bodies, strict
JSON responses, the field a pydantic error names, the admin bearer-token guard, and text without lone surrogates."""
from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator, ValidationError
from starlette.exceptions import HTTPException

from seam import strict_json

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
GUARDED_PREFIXES = ("/admin/", "/alerts")
_SURROGATE = re.compile("[\ud800-\udfff]")


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error shape every refusal uses."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def has_admin_token(authorization: str, admin_token: str | None) -> bool:
    supplied = authorization.removeprefix("Bearer ").strip()
    return bool(admin_token) and secrets.compare_digest(supplied.encode(), admin_token.encode())


def no_lone_surrogates(value: str) -> str:
    """JSON may escape a lone UTF-16 surrogate ("\\ud800"); no encoder can take it, so it is refused here."""
    found = _SURROGATE.search(value)
    if found:
        raise ValueError(f"contains a lone surrogate (U+{ord(found.group()):04X}) at character {found.start()}; "
                         "send valid Unicode")
    return value


Text = Annotated[str, AfterValidator(no_lone_surrogates)]


class FiniteJSONResponse(JSONResponse):
    """Every JSON route's response class: a NaN or infinite float becomes null instead of failing the request with a
    500 (Starlette refuses them, rightly, as not JSON)."""

    def render(self, content) -> bytes:
        return super().render(strict_json.finite(content))


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None):
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.code, self.headers = code, headers

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(status_code=error.status, content=error.body(), headers=error.headers)


def field_of(loc: tuple) -> str:
    return ".".join(str(part) for part in loc if part not in ("body", "query", "path"))


def invalid_body(error: ValidationError | RequestValidationError) -> APIError:
    """A 400 naming the first field pydantic refused ('body' when it is not JSON at all)."""
    first = error.errors()[0]
    field = "body" if first["type"] == "json_invalid" else field_of(tuple(first["loc"])) or "body"
    return APIError(400, f"{field}: {first['msg']}", field)


def bearer_guard(admin_token: str | None):
    """A dependency that refuses (401) any request without the admin bearer token (and declares it in OpenAPI)."""
    scheme = HTTPBearer(auto_error=False, description="GOVERNOR_ADMIN_TOKEN")

    def require_admin(credentials: HTTPAuthorizationCredentials | None = Depends(scheme)) -> None:
        if credentials is None or not has_admin_token(credentials.credentials, admin_token):
            raise APIError(401, "a valid bearer token (GOVERNOR_ADMIN_TOKEN) is required", kind="authentication_error")
    return require_admin


def install_error_handlers(app: FastAPI, on_prompt_too_long: Callable[[], None] | None = None) -> None:
    """APIError, request validation errors and Starlette's own HTTP errors (404, 405, bodies that are not UTF-8)
    become OpenAI-style error bodies (400 names the field). on_prompt_too_long() counts each prompt refused for its
    length."""
    @app.exception_handler(APIError)
    async def _api_error(_: Request, error: APIError):
        return error_response(error)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, error: HTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return error_response(APIError(error.status_code, str(error.detail), kind=kind, headers=error.headers))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, error: RequestValidationError):
        refusal = invalid_body(error)
        if on_prompt_too_long is not None and error.errors()[0]["type"] == "string_too_long" \
                and refusal.param.startswith(("prompt", "messages")):
            on_prompt_too_long()
        return error_response(refusal)
