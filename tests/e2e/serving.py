"""`governor serve` as a real process for fault tests: started (optionally through tests.e2e.injected_serve), waited
for, and its admin API read."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import yaml

from tests.controller.conftest import fast_policy
from tests.controller.server import AUTH, ROOT, TOKEN
from tests.dashboards.servers import Server, free_port

ENV = {**os.environ, "GOVERNOR_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
QUIET_POLICY = fast_policy(trial={"min_predicted_gain": 100.0}, slo={"builtin_evaluator": False})  # no trials


def write_policy(folder: Path, policy: dict = QUIET_POLICY) -> Path:
    path = folder / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


def start_serve(folder: Path, name: str, *flags: str, injected: dict[str, str] | None = None,
                port: int | None = None) -> tuple[str, Server]:
    """(base URL, Server) once /health answers 200; injected: tests.e2e.injected_serve's environment."""
    port = port or free_port()
    module = "tests.e2e.injected_serve" if injected else "governor.cli"
    server = Server(name, [sys.executable, "-m", module, "serve", "--port", str(port), *flags], folder,
                    env={**ENV, **(injected or {})})
    url = f"http://127.0.0.1:{port}"
    server.wait_ready(f"{url}/health", timeout=180)
    return url, server


def decisions(url: str, action: str) -> list[dict]:
    return httpx.get(f"{url}/admin/decisions", params={"action": action}).json()["decisions"]


def post_alerts(url: str, payload: dict) -> httpx.Response:
    return httpx.post(f"{url}/alerts", json=payload, headers=AUTH, timeout=30)
