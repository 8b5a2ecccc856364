"""The served app as `governor serve` builds it (engine + controller router) on a real loopback uvicorn."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import uvicorn

from controller.cli import ControlPlane
from engine.api import create_app
from engine.service import EngineService

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(service: EngineService, plane: ControlPlane | None):
    """Yields the base URL of the app with the controller's router mounted (or the engine's own seam if None)."""
    port = free_port()
    app = create_app(service, "governor-moe", TOKEN, admin_router=plane.router if plane else None)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    service.start()
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        service.stop()
