"""The HTTP API of `governor control`: the controller's admin router and alert webhook, and /health (the controller's
loop and its store), on a uvicorn server in a background thread."""
from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from controller.plane import ControlPlane
from engine.server.health import Health
from seam.http import FiniteJSONResponse, install_error_handlers
from seam.openapi import HEALTH, exact_openapi


def create_control_app(plane: ControlPlane) -> FastAPI:
    app = FastAPI(title="Governor controller", version="0.1.0", default_response_class=FiniteJSONResponse)
    app.openapi = exact_openapi(app)
    install_error_handlers(app)
    health = Health({"controller": plane.fault, "store": plane.controller.store.fault})
    app.include_router(plane.router)

    @app.get("/health", responses=HEALTH)
    def liveness():
        """503 with the reasons while the controller's loop is dead or its store cannot be written; a standby is
        healthy (GET /admin/controller says which process leads)."""
        problems = health.problems()
        if problems:
            return JSONResponse(status_code=503, content={"status": "unavailable", "reasons": problems})
        return {"status": "ok"}

    return app


class ControlServer:
    """uvicorn in a background thread; start() returns once it listens (RuntimeError if it does not)."""

    def __init__(self, app: FastAPI, host: str, port: int):
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="governor-control-http", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                config = self.server.config
                raise RuntimeError(f"cannot listen on {config.host}:{config.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
