"""MkDocs hook: the HTTP API page, rendered at every build from the OpenAPI documents of the apps the service
builds: `governor serve` (engine, controller, dashboard), `governor serve --no-controller` (the engine's own side of
the seam) and `governor control` (the controller alone). The apps are built by the same functions the commands use
(governor.serve.served_app, governor.control_app.create_control_app), with the shipped governor-moe model and the
default settings, and never started. Nothing is checked in, so the page cannot go stale;
if the apps can no longer be built, the docs build fails.

The documents themselves are published beside the page (openapi.json, openapi-engine.json, openapi-control.json).
WHAT holds one line per operation that has no docstring; a line for an operation that no longer exists fails the
build."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PAGE = "api.md"
MARKER = "<!-- openapi -->"
METHODS = ("get", "post", "put", "patch", "delete")
APPS = {  # key: (heading, command, published file)
    "serve": ("`governor serve`", "governor serve", "openapi.json"),
    "engine": ("`governor serve --no-controller`", "governor serve --no-controller", "openapi-engine.json"),
    "control": ("`governor control --port N`", "governor control", "openapi-control.json"),
}

# one line per operation without a docstring: (app, METHOD, path); app None = the same in every app serving it
WHAT = {
    (None, "GET", "/v1/models"): "The one model this server serves (OpenAI's list shape).",
    (None, "POST", "/v1/completions"): "OpenAI-compatible text completion, whole or streamed (`stream: true`: "
                                       "server-sent events ending in `data: [DONE]`).",
    (None, "POST", "/v1/chat/completions"): "OpenAI-compatible chat completion through the model's chat template, "
                                            "whole or streamed.",
    (None, "GET", "/metrics"): "Prometheus text exposition (every series is listed in "
                               "[Metrics, rules and traces](operations/observability.md)).",
    ("serve", "GET", "/admin/window"): "The controller's latest closed Window; reading it changes nothing. 404 until "
                                       "the controller has closed one.",
    ("serve", "GET", "/admin/config"): "The config the controller holds in use.",
    ("engine", "GET", "/admin/config"): "The config the engine serves from its next step (during an experiment, "
                                        "the arm in use).",
    ("serve", "PUT", "/admin/config"): "Pin a config: checked by the engine, applied, held (no trials) until "
                                       "`POST /admin/release`. Fields left out take their defaults.",
    (None, "GET", "/admin/controller"): "The controller's state: policy, config, last known good, pin, trial in "
                                        "progress, calibration, degraded replicas, and `leadership` (leader or "
                                        "standby).",
    (None, "POST", "/admin/release"): "Lift the operator's pin; the pinned config becomes the last known good and "
                                      "trials resume (the other speculation mode is probed at the next window). "
                                      "409 if nothing is pinned.",
    (None, "POST", "/admin/rollback"): "Return to the last known good config, ending any trial and lifting any pin; "
                                       "recorded as a `rollback` decision.",
    (None, "GET", "/admin/decisions"): "The decision log, newest first: each decision's action, reason, inputs, "
                                       "predicted and measured gain. `action` filters by action.",
    (None, "GET", "/admin/history"): "Config versions, newest first, and the version that is last known good.",
    (None, "GET", "/admin/trials"): "Trials, newest first, with their outcome and the judge's evidence.",
    (None, "GET", "/admin/alerts"): "Alert notifications received, newest first, each with its action's outcome "
                                    "(`acted`, `skipped`, `failed`, `deferred`).",
    (None, "GET", "/admin/policy"): "The policy in force, its name, and the names of the shipped policies.",
    (None, "PUT", "/admin/policy"): "Switch policy: `{\"name\": \"optuna\"}` for a shipped one, or `{\"policy\": "
                                    "{...}}` for a whole document (validated first; a bad one changes nothing).",
    (None, "POST", "/admin/search/start"): "Switch to the shipped `optuna` policy (409 if a search runs already).",
    (None, "POST", "/admin/search/stop"): "Back to the policy in use before the search, or `default` "
                                          "(409 if no search runs).",
    (None, "GET", "/dashboard/state"): "The operator dashboard's payload once (the page itself reads it every "
                                       "second from `/dashboard/stream`).",
}

_documents: dict[str, dict] | None = None


def _build_documents() -> dict[str, dict]:
    """The three apps' OpenAPI documents, built in this checkout (not whatever `engine` an install points at)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from controller.clients import InProcessClient
    from controller.plane import build_control_plane
    from engine.factory import build_engine
    from engine.server.service import EngineService
    from engine.telemetry.live import LiveTelemetry
    from engine.telemetry.metrics import EngineMetrics
    from governor.control_app import create_control_app
    from governor.loaders import load_models
    from governor.serve import served_app
    from governor.settings import Settings

    models = load_models("governor-moe", device=torch.device("cpu"), dtype=torch.float32)
    metrics, live = EngineMetrics(models.name), LiveTelemetry()
    engine = build_engine(models, sinks=[metrics, live])
    service = EngineService(engine)
    try:
        with tempfile.TemporaryDirectory() as folder:
            plane = build_control_plane(InProcessClient(engine), "default", f"sqlite:///{folder}/docs.db", "token")
            try:
                settings = Settings(admin_token="token")
                return {"serve": served_app(service, models.name, settings, metrics, live, plane).openapi(),
                        "engine": served_app(service, models.name, settings, metrics, live, None).openapi(),
                        "control": create_control_app(plane).openapi()}
            finally:
                plane.controller.store.close()
    finally:
        engine.close()


def on_files(files, config):
    global _documents
    try:
        _documents = _build_documents()
    except Exception as error:  # noqa: BLE001 -- any failure to build the apps must stop the docs build
        raise PluginError(f"docs/hooks/openapi.py: cannot build the apps' OpenAPI documents: {error!r}") from error
    for key, (_, _, name) in APPS.items():
        files.append(File.generated(config, name, content=json.dumps(_documents[key], indent=2) + "\n"))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/{PAGE} lost its {MARKER} marker: the generated API reference has nowhere to go")
    return markdown.replace(MARKER, render(_documents))


# ---- rendering ----------------------------------------------------------------------------------------------------

def _operations(document: dict) -> dict[tuple[str, str], dict]:
    return {(method.upper(), path): operation for path, operations in document["paths"].items()
            for method, operation in operations.items() if method in METHODS}


def _strip(operation: dict) -> dict:
    return {k: v for k, v in operation.items() if k != "operationId"}


def _own(app: str, method: str, path: str, operation: dict, served: dict) -> bool:
    """Whether an app's operation gets its own entry: serve's always; another app's where it differs from serve's,
    and every /admin/ route of the engine alone (its own side of the seam, not the controller's router, even where
    the two documents read alike)."""
    if app == "serve" or (app == "engine" and path.startswith("/admin/")):
        return True
    return _strip(operation) != _strip(served.get((method, path), {}))


def _what(app: str, method: str, path: str, operation: dict, used: set) -> str:
    for key in ((app, method, path), (None, method, path)):
        if key in WHAT:
            used.add(key)
            return WHAT[key]
    text = operation.get("description") or operation.get("summary") or ""
    return " ".join(text.split())


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _anchor(app: str, method: str, path: str) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in path.lower()).strip("-")
    return f"{app}-{method.lower()}-{slug}"


def _schema_anchor(name: str) -> str:
    return f"schema-{name.lower()}"


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _range(schema: dict) -> str | None:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if low is not None and high is not None:
        left, right = "(" if "exclusiveMinimum" in schema else "[", ")" if "exclusiveMaximum" in schema else "]"
        return f"{left}{_number(low)}, {_number(high)}{right}"
    if low is not None:
        return f"{'>' if 'exclusiveMinimum' in schema else '≥'} {_number(low)}"
    if high is not None:
        return f"{'<' if 'exclusiveMaximum' in schema else '≤'} {_number(high)}"
    return None


def _leaf_bounds(schema: dict) -> str:
    """Bounds of a value itself: its range, its length, its pattern."""
    interval, parts = _range(schema), []
    if "minLength" in schema and "maxLength" in schema:
        parts.append(f"length {schema['minLength']} to {schema['maxLength']}")
    elif "minLength" in schema:
        parts.append(f"length ≥ {schema['minLength']}")
    elif "maxLength" in schema:
        parts.append(f"length ≤ {schema['maxLength']}")
    if "pattern" in schema:
        parts.append(f"matching `{schema['pattern']}`")
    return (f" {interval}" if interval else "") + (f" ({', '.join(parts)})" if parts else "")


def _count_bounds(schema: dict, noun: str) -> str:
    """Bounds of a container: how many items or entries."""
    low = schema.get("minItems", schema.get("minProperties"))
    high = schema.get("maxItems", schema.get("maxProperties"))
    if low is not None and high is not None:
        return f" (exactly {low} {noun})" if low == high else f" ({low} to {high} {noun})"
    if low is not None:
        return f" (at least {low} {noun})"
    if high is not None:
        return f" (at most {high} {noun})"
    return ""


def _type(schema: dict) -> str:
    if not schema:
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{_schema_anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema and "type" not in schema:
            return " or ".join(_type(part) for part in schema[key])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        if "prefixItems" in schema:
            return "[" + ", ".join(_type(item) for item in schema["prefixItems"]) + "]"
        text = "array" + _count_bounds(schema, "items")
        return text + (f" of {_type(schema['items'])}" if "items" in schema else "")
    if kind == "object":
        named = [f"`{name}`" + (" (required)" if name in schema.get("required", []) else "")
                 for name in schema.get("properties", {})]
        extra = schema.get("additionalProperties")
        text = "object" + _count_bounds(schema, "entries")
        if named:
            text += " with " + ", ".join(named)
        if isinstance(extra, dict):
            text += (", others " if named else " of ") + _type(extra)
        return text
    return kind + _leaf_bounds(schema)


def _default(schema: dict, required: bool) -> str:
    if required:
        return "required"
    if "default" in schema:
        return f"`{json.dumps(schema['default'])}`"
    return ""


def _operation(app: str, method: str, path: str, operation: dict, used: set) -> list[str]:
    lines = [f"### {method} {path} {{#{_anchor(app, method, path)}}}", "",
             _what(app, method, path, operation, used), ""]
    if operation.get("security"):
        lines += ["**Token:** `Authorization: Bearer $GOVERNOR_ADMIN_TOKEN` (401 without it).", ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
        for p in parameters:
            schema = p.get("schema", {})
            lines.append(f"| `{p['name']}` | {p['in']} | {_cell(_type(schema))} | "
                         f"{_cell(_default(schema, p.get('required', False)))} | "
                         f"{_cell(p.get('description') or schema.get('description', ''))} |")
        lines.append("")
    body = operation.get("requestBody")
    if body:
        content = body.get("content", {})
        for media, entry in content.items():
            lines += [f"**Body** ({media}{', required' if body.get('required') else ''}): "
                      f"{_type(entry.get('schema', {}))}", ""]
    lines += ["| status | meaning |", "| --- | --- |"]
    for status, response in sorted(operation.get("responses", {}).items()):
        media = ", ".join(f"`{m}`" for m in response.get("content", {}) if m != "application/json")
        meaning = response.get("description", "")
        if status == "200" and meaning == "Successful Response":
            meaning = "done"
        lines.append(f"| {status} | {_cell(meaning)}{' (' + media + ')' if media else ''} |")
    return lines + [""]


def _schema(name: str, schema: dict) -> list[str]:
    lines = [f"### {name} {{#{_schema_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [" ".join(schema["description"].split()), ""]
    properties = schema.get("properties")
    if not properties:
        return lines + [f"Type: {_type({k: v for k, v in schema.items() if k != 'description'})}", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for field, spec in properties.items():
        lines.append(f"| `{field}` | {_cell(_type(spec))} | {_cell(_default(spec, field in required))} | "
                     f"{_cell(spec.get('description', ''))} |")
    extra = schema.get("additionalProperties")
    if extra is False:
        lines += ["", "Other fields are refused (400 naming the field)."]
    return lines + [""]


def render(documents: dict[str, dict]) -> str:
    operations = {app: _operations(doc) for app, doc in documents.items()}
    served = operations["serve"]
    used: set = set()
    every = list(dict.fromkeys(key for ops in operations.values() for key in ops))   # serve's order, then the rest
    lines = ["## Endpoints", "",
             "A tick marks the apps that serve an operation; where two apps serve the same path differently, each "
             "has its own entry below.", "",
             "| operation | token | `serve` | `serve --no-controller` | `control` |", "| --- | --- | --- | --- | --- |"]
    for method, path in every:
        marks = []
        for app in APPS:
            operation = operations[app].get((method, path))
            if operation is None:
                marks.append("")
                continue
            home = app if _own(app, method, path, operation, served) else "serve"
            marks.append(f"[✓](#{_anchor(home, method, path)})")
        secured = any(ops.get((method, path), {}).get("security") for ops in operations.values())
        lines.append(f"| `{method} {path}` | {'yes' if secured else ''} | {' | '.join(marks)} |")
    lines.append("")
    for app, (heading, command, published) in APPS.items():
        own = {key: op for key, op in operations[app].items() if _own(app, *key, op, served)}
        lines += [f"## {heading}", ""]
        if app == "serve":
            lines += [f"Everything `{command}` serves. The document: [{published}]({published}).", ""]
        else:
            lines += [f"What `{command}` serves differently from `governor serve`, or in its place (the rest is "
                      f"as above). The document: [{published}]({published}).", ""]
        for (method, path), operation in own.items():
            lines += _operation(app, method, path, operation, used)
    schemas: dict[str, dict] = {}
    for app, document in documents.items():
        for name, schema in document.get("components", {}).get("schemas", {}).items():
            if name in schemas and schemas[name] != schema:
                raise PluginError(f"schema {name!r} differs between the apps' documents; name them apart")
            schemas[name] = schema
    lines += ["## Schemas", "", "Request bodies and the error body, as the documents declare them. Ranges are "
              "intervals: `[0, 16]` includes both ends, `(0, 1]` leaves out 0.", ""]
    for name in sorted(schemas):
        lines += _schema(name, schemas[name])
    stale = sorted(set(WHAT) - used)
    if stale:
        raise PluginError(f"docs/hooks/openapi.py: WHAT describes operations no app serves any more: {stale}")
    return "\n".join(lines)
