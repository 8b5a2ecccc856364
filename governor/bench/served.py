"""A real `governor serve` process on a loopback port for the serving benchmarks: started, probed, measured (RSS,
/metrics) and stopped."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from engine.server.local_server import free_port


class ServedProcess:
    def __init__(self, model: str, ep: int = 1, env: dict[str, str] | None = None, start_timeout: float = 300.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._folder = tempfile.TemporaryDirectory(prefix="governor-bench-")
        self.log = Path(self._folder.name) / "serve.log"
        command = [sys.executable, "-m", "governor.cli", "serve", "--port", str(self.port), "--model", model,
                   "--ep", str(ep), "--db", f"sqlite:///{self._folder.name}/governor.db"]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **(env or {})})
        self._wait_healthy(start_timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"governor serve exited with {self.process.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"governor serve did not answer /health within {timeout:g} s")

    def rss_bytes(self) -> int:
        """Resident memory of the server process (its expert-parallel workers are counted apart)."""
        return _rss_bytes(self.process.pid)

    def rank_rss_bytes(self) -> dict[str, int]:
        """Resident memory per expert-parallel rank: "rank 0" is the server, "rank 1".. its spawned workers in the
        order they started (multiprocessing's resource tracker, also a child, is left out)."""
        workers = sorted(pid for pid in _children(self.process.pid)
                         if b"multiprocessing.spawn" in _cmdline(pid) and b"resource_tracker" not in _cmdline(pid))
        return {f"rank {rank}": _rss_bytes(pid) for rank, pid in enumerate([self.process.pid, *workers])}

    def metric(self, name: str, **labels: str) -> float:
        """The value of the sample of `name` on /metrics that carries these labels (and any model)."""
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith((name + "{", name + " ")) and all(label in line for label in wanted):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._folder.cleanup()

    def __enter__(self) -> ServedProcess:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""
