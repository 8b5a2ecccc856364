"""What every HTTP router of the service shares: OpenAI-style error bodies, the field a pydantic error names, and
the admin bearer-token guard."""
from __future__ import annotations

import secrets

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None):
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.code, self.headers = code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(status_code=error.status, content=error.body(), headers=error.headers)


def field_of(loc: tuple) -> str:
    return ".".join(str(part) for part in loc if part not in ("body", "query", "path"))


def invalid_body(error: ValidationError) -> APIError:
    """A 400 naming the first field pydantic refused."""
    first = error.errors()[0]
    field = field_of(tuple(first["loc"])) or "body"
    return APIError(400, f"{field}: {first['msg']}", field)


def bearer_guard(admin_token: str | None):
    """A dependency that refuses (401) any request without the admin bearer token."""
    def require_admin(request: Request) -> None:
        supplied = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not admin_token or not secrets.compare_digest(supplied.encode(), admin_token.encode()):
            raise APIError(401, "a valid bearer token (GOVERNOR_ADMIN_TOKEN) is required", kind="authentication_error")
    return require_admin


def install_error_handlers(app: FastAPI) -> None:
    """APIError and request validation errors become OpenAI-style error bodies (400 names the field)."""
    @app.exception_handler(APIError)
    async def _api_error(_: Request, error: APIError):
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, error: RequestValidationError):
        first = error.errors()[0]
        field = "body" if first["type"] == "json_invalid" else field_of(tuple(first["loc"])) or "body"
        return error_response(APIError(400, f"{field}: {first['msg']}", field))
