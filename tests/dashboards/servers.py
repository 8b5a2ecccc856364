"""Real servers for tests: each started as its own process (no shell in between), readiness-checked, and stopped
by the PID that was started. Every wait is bounded; a timeout fails with the server's log."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str:
    """The path of a Debian-packaged tool; missing is a failure, never a skip (.ci/run installs them)."""
    path = shutil.which(name)
    assert path, f"{name} is not installed: apt-get install prometheus prometheus-alertmanager (.ci/run does)"
    return path


class Server:
    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict | None = None):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-6000:]

    def wait_until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode} before {what}:\n{self.log()}")
            try:
                if predicate():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"{self.name}: no {what} within {timeout:.0f}s:\n{self.log()}")

    def wait_ready(self, url: str, timeout: float) -> None:
        self.wait_until(lambda: httpx.get(url, timeout=5).status_code == 200, timeout, f"200 from {url}")

    def stop(self, timeout: float = 20) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        self._log.close()
