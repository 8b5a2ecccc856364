"""Serve an app on a free loopback port from a background thread, for in-process benchmarks and tests."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from engine.server.service import EngineService


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving_in_thread(app: FastAPI, service: EngineService, start_timeout: float = 30.0) -> Iterator[str]:
    """Start service and app; yield the base URL; stop both. Raises RuntimeError if uvicorn does not start."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    service.start()
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{port} within {start_timeout:g} s")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        service.stop()
