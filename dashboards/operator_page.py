"""The operator web page at `/`: static HTML/JS/CSS from dashboards/web/, Plotly from its installed package (no CDN),
and one server-sent event per second with the live series and the controller's config, history, decisions and
alerts. Operator actions go from the page straight to the token-guarded admin API."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, StreamingResponse

from controller.loop import Controller
from engine.live import LiveTelemetry
from policies import shipped_policies
from seam import EngineConfig

PAGE = Path(__file__).parent / "web"
ASSETS = {"app.js": PAGE / "app.js", "app.css": PAGE / "app.css",
          "plotly.min.js": Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))}
PUSH_SECONDS = 1.0
SERIES_SECONDS = 120
ROWS = 50


def create_dashboard_router(live: LiveTelemetry, config: Callable[[], EngineConfig],
                            controller: Controller | None = None) -> APIRouter:
    """config: the engine's config in use (read when there is no controller)."""
    router = APIRouter()

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
        return dashboard_state(live, config, controller)

    @router.get("/dashboard/stream", include_in_schema=False)
    async def stream():
        return StreamingResponse(_events(live, config, controller), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    return router


async def _events(live: LiveTelemetry, config, controller) -> AsyncIterator[str]:
    while True:
        payload = await asyncio.to_thread(dashboard_state, live, config, controller)
        yield f"data: {json.dumps(payload)}\n\n"
        await asyncio.sleep(PUSH_SECONDS)


def dashboard_state(live: LiveTelemetry, config: Callable[[], EngineConfig], controller: Controller | None) -> dict:
    state = {"live": live.series(SERIES_SECONDS), "controller": None, "history": [], "decisions": [], "alerts": [],
             "policies": shipped_policies()}
    if controller is None:
        current = config()
        return {**state, "config": current.model_dump(), "speculation": "off" if not current.speculative_len else "on"}
    store, now = controller.store, controller.state()
    decisions = store.decisions(ROWS)
    return {**state, "config": now["config"], "controller": now,
            "speculation": speculation_state(EngineConfig(**now["config"]), decisions, now["pin"]),
            "history": store.config_versions(ROWS), "decisions": decisions, "alerts": store.alerts(ROWS)}


def speculation_state(current: EngineConfig, decisions: list[dict], pin: dict | None) -> str:
    """'on'; 'fallback' when the controller turned speculation off (a kept fallback probe, or an alert's pin);
    'off' when it is off otherwise (an operator's pin, or the engine started that way)."""
    if current.speculative_len:
        return "on"
    if pin is not None and pin["owner"].startswith("alert:"):
        return "fallback"
    if any(d["action"] == "fallback" and d["config_version"] == current.version for d in decisions):
        return "fallback"
    return "off"
