"""The served app as `governor serve` builds it (engine + controller router) on a real loopback uvicorn."""
from __future__ import annotations

from pathlib import Path

from controller.plane import ControlPlane
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def serving(service: EngineService, plane: ControlPlane | None):
    """Yields the base URL of the app with the controller's router mounted (or the engine's own seam if None)."""
    return serving_in_thread(create_app(service, "governor-moe", TOKEN, admin_router=plane.router if plane else None),
                             service)
