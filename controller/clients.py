"""The controller's side of the seam: one EngineClient interface, in-process or over HTTP to one or more replicas."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import httpx

from controller.window_stats import merge_windows, window_from_dict
from engine.engine import Engine
from seam import EngineConfig, Window


class EngineClientError(RuntimeError):
    """An engine refused a config or could not be reached; the message names which and why."""


class EngineClient(Protocol):
    def snapshot(self) -> Window:
        """Close the engine's current window and return it (the controller is its only reader)."""

    def apply(self, config: EngineConfig) -> None:
        """Take config into use between two steps."""

    def config(self) -> EngineConfig:
        """The config in use (or pending)."""


class InProcessClient:
    def __init__(self, engine: Engine):
        self.engine = engine

    def snapshot(self) -> Window:
        return self.engine.snapshot()

    def apply(self, config: EngineConfig) -> None:
        try:
            self.engine.apply(config)
        except ValueError as error:
            raise EngineClientError(str(error)) from error

    def config(self) -> EngineConfig:
        return self.engine.config


class HttpClient:
    """Remote replicas through their GET /admin/window and PUT /admin/config; windows are merged."""

    def __init__(self, urls: Sequence[str], token: str | None, timeout_seconds: float = 10.0):
        if not urls:
            raise ValueError("at least one engine URL is needed")
        self.urls = [url.rstrip("/") for url in urls]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(headers=headers, timeout=timeout_seconds)

    def _call(self, method: str, url: str, **kwargs) -> dict:
        try:
            reply = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as error:
            raise EngineClientError(f"{url}: {error}") from error
        if reply.status_code != 200:
            raise EngineClientError(f"{method} {url}: HTTP {reply.status_code}: {reply.text[:300]}")
        return reply.json()

    def snapshot(self) -> Window:
        return merge_windows([window_from_dict(self._call("GET", f"{url}/admin/window")) for url in self.urls])

    def apply(self, config: EngineConfig) -> None:
        for url in self.urls:
            self._call("PUT", f"{url}/admin/config", content=config.model_dump_json())

    def config(self) -> EngineConfig:
        return EngineConfig.model_validate(self._call("GET", f"{self.urls[0]}/admin/config"))
