"""An OpenAPI document as an app of the service really behaves: every request body declared, errors in the OpenAI
shape with the status codes the edge and the routes answer (400 for a bad field, never 422), writes marked as needing
the token."""
from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from seam.http import GUARDED_PREFIXES, WRITE_METHODS

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def error(description: str) -> dict:
    return {"description": description, **_ERROR}


REF = "#/components/schemas/{model}"
COMPONENTS_KEY = "x-governor-components"     # carried by an operation until _exact moves it into components
ERRORS = {400: error("a field is invalid; error.param names it")}
HEALTH = {200: {"description": "every component is up"},
          503: {"description": "a component is down (or, for /ready, new requests would be refused)", "content": {
              "application/json": {"schema": {
                  "type": "object", "required": ["status", "model", "reasons"],
                  "properties": {"status": {"const": "unavailable"}, "model": {"type": "string"},
                                 "reasons": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}}


def json_body(schema: type[BaseModel] | dict, *models: type[BaseModel]) -> dict:
    """openapi_extra for a route that parses its body itself: the body's schema (a model's, or one that refers to
    `models` as #/components/schemas/NAME), required. The models' schemas become components."""
    components = {}
    for model in models:
        components.update(_model_schemas(model))
    if not isinstance(schema, dict):
        components.update(_model_schemas(schema))
        schema = {"$ref": REF.format(model=schema.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            COMPONENTS_KEY: components}


def _model_schemas(model: type[BaseModel]) -> dict[str, dict]:
    schema = model.model_json_schema(ref_template=REF)
    return {**schema.pop("$defs", {}), model.__name__: schema}


def allowed_methods(app: FastAPI) -> dict[str, set[str]]:
    """Each documented path without parameters -> its documented methods (HEAD with GET)."""
    table = {}
    for path, operations in app.openapi()["paths"].items():
        if "{" not in path:
            methods = {method.upper() for method in operations}
            table[path] = methods | ({"HEAD"} if "GET" in methods else set())
    return table


def exact_openapi(app: FastAPI) -> Callable[[], dict]:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = _exact(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema
    return openapi


def _exact(schema: dict) -> dict:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            components.update(operation.pop(COMPONENTS_KEY, {}))
            responses = operation["responses"]
            had_validation = responses.pop("422", None) is not None
            if had_validation or "requestBody" in operation:
                responses.setdefault("400", error("a field is invalid; error.param names it"))
            if "requestBody" in operation:
                responses["413"] = error("the body is larger than GOVERNOR_MAX_BODY_BYTES")
            if method.upper() in WRITE_METHODS and path.startswith(GUARDED_PREFIXES):
                responses["401"] = error("the admin bearer token is missing or wrong")
    return schema
