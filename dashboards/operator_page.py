"""The operator web page at `/`: static HTML/JS/CSS from dashboards/web/, Plotly from its installed package (no CDN),
and one server-sent event per second with the live series and the controller's config, history, decisions and
alerts. Operator actions go from the page straight to the token-guarded admin API."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, StreamingResponse

from controller.loop import Controller
from dashboards.broadcast import Broadcast
from engine.telemetry.live import LiveTelemetry
from policies import shipped_policies
from seam import EngineConfig
from seam.http import APIError

PAGE = Path(__file__).parent / "web"
ASSETS = {"app.js": PAGE / "app.js", "app.css": PAGE / "app.css",
          "plotly.min.js": Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))}
PUSH_SECONDS = 1.0
SERIES_SECONDS = 120
ROWS = 50
MAX_CLIENTS = 32


def create_dashboard_router(live: LiveTelemetry, config: Callable[[], EngineConfig],
                            controller: Controller | None = None, max_clients: int = MAX_CLIENTS,
                            on_refuse: Callable[[], None] = lambda: None) -> APIRouter:
    """config: the engine's config in use (read when there is no controller). At most max_clients event streams
    are open at once (one more gets 429, and on_refuse() counts it); all of them share one payload per second."""
    router = APIRouter()
    broadcast = Broadcast(lambda: dashboard_state(live, config, controller), max_clients, PUSH_SECONDS)

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse((PAGE / "index.html").read_text())

    @router.get("/dashboard/assets/{name}", include_in_schema=False)
    async def asset(name: str):
        if name not in ASSETS:
            raise HTTPException(404, f"no asset {name!r}")
        return FileResponse(ASSETS[name])

    @router.get("/dashboard/state")
    async def state():
        return await asyncio.to_thread(dashboard_state, live, config, controller)

    @router.get("/dashboard/stream", include_in_schema=False)
    async def stream():
        if broadcast.full:
            on_refuse()
            raise APIError(429, f"{max_clients} dashboard streams are open already (GOVERNOR_MAX_SSE_CLIENTS)",
                           kind="rate_limit_error", code="sse_clients", headers={"Retry-After": "5"})
        return StreamingResponse(broadcast.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    return router


def dashboard_state(live: LiveTelemetry, config: Callable[[], EngineConfig], controller: Controller | None) -> dict:
    state = {"live": live.series(SERIES_SECONDS), "controller": None, "history": [], "decisions": [], "alerts": [],
             "policies": shipped_policies()}
    if controller is None:
        current = config()
        return {**state, "config": current.model_dump(),
                "speculation": "on" if current.longest_draft_len else "off"}
    store, now = controller.store, controller.state()
    decisions = store.decisions(ROWS)
    return {**state, "config": now["config"], "controller": now,
            "speculation": speculation_state(EngineConfig(**now["config"]), decisions, now["pin"]),
            "history": store.config_versions(ROWS), "decisions": decisions, "alerts": store.alerts(ROWS)}


def speculation_state(current: EngineConfig, decisions: list[dict], pin: dict | None) -> str:
    """'on'; 'fallback' when the controller turned speculation off (a kept fallback probe, or an alert's pin);
    'off' when it is off otherwise (an operator's pin, or the engine started that way)."""
    if current.longest_draft_len:
        return "on"
    if pin is not None and pin["owner"].startswith("alert:"):
        return "fallback"
    if any(d["action"] == "fallback" and d["config_version"] == current.version for d in decisions):
        return "fallback"
    return "off"
