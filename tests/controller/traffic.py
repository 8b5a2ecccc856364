"""Closed-loop traffic for controller tests: in-process (one thread driving the engine) or over HTTP (clients)."""
from __future__ import annotations

import itertools
import threading

import httpx

from engine.engine import Engine
from seam import SamplingParams

GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


class ClosedLoopTraffic:
    """Drives the engine (add_request + step from one thread, as EngineService does) until stopped."""

    def __init__(self, engine: Engine, prompts: list[list[int]], concurrency: int = 4, params=GREEDY):
        self.engine, self.prompts, self.concurrency, self.params = engine, prompts, concurrency, params
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-traffic", daemon=True)

    def __enter__(self) -> ClosedLoopTraffic:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        ids = itertools.count()
        prompts = itertools.cycle(self.prompts)
        while not self._stop.is_set():
            scheduler = self.engine.scheduler
            while len(scheduler.running) + len(scheduler.waiting) < self.concurrency:
                self.engine.add_request(f"t{next(ids)}", next(prompts), self.params)
            self.engine.step()
        while self.engine.has_work:
            self.engine.step()


class HttpTraffic:
    """`clients` HTTP clients, each sending greedy completions back to back."""

    def __init__(self, url: str, clients: int = 4):
        self.url, self.stop = url, threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _client(self):
        body = {"model": "governor-moe", "prompt": "def fibonacci(n):\n    ", "max_tokens": 48, "temperature": 0,
                "ignore_eos": True}
        with httpx.Client(timeout=60) as http:
            while not self.stop.is_set():
                http.post(f"{self.url}/v1/completions", json=body)
