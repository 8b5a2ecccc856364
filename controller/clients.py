"""The controller's side of the seam: one EngineClient interface, in-process or over HTTP to one or more replicas."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import httpx

from controller.window_stats import merge_windows, window_from_dict
from engine.engine import Engine
from seam import EngineConfig, Experiment, Window


class EngineClientError(RuntimeError):
    """An engine refused a config or could not be reached; the message names which and why."""


class ApplyFailed(EngineClientError):
    """A config the engines accepted could not be taken into use (a replica failed half way, or went away)."""


READER = "controller"   # the engine keeps a window per reader; this is the controller's


class EngineClient(Protocol):
    degraded: dict[str, str]    # replica -> why it did not answer last time (empty: the whole fleet answers)

    def snapshot(self) -> Window:
        """Close the controller's window on the engine(s) and return it (other readers' windows are untouched)."""

    def check(self, config: EngineConfig) -> None:
        """Raise EngineClientError if an engine would refuse config; changes nothing."""

    def apply(self, change: EngineConfig | Experiment) -> None:
        """Take a config into use between two steps, or start a switchback Experiment (a later config ends it), on
        every replica that answers, or on none."""

    def config(self) -> EngineConfig:
        """The config in use (or pending)."""

    def versions(self) -> dict[str, int]:
        """Replica -> the version of the config it serves (or will serve from its next step); while an Experiment
        runs, the version of the arm in use."""


class InProcessClient:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.degraded: dict[str, str] = {}

    def snapshot(self) -> Window:
        return self.engine.snapshot(READER)

    def check(self, config: EngineConfig) -> None:
        try:
            self.engine.check(config)
        except ValueError as error:
            raise EngineClientError(str(error)) from error

    def apply(self, change: EngineConfig | Experiment) -> None:
        try:
            self.engine.apply(change)
        except ValueError as error:
            raise EngineClientError(str(error)) from error

    def config(self) -> EngineConfig:
        return self.engine.config

    def versions(self) -> dict[str, int]:
        return {"engine": self.engine.desired_config.version}


class Unreachable(EngineClientError):
    """A replica did not answer (down or partitioned), as opposed to one that refused."""


class HttpClient:
    """Remote replicas through their GET /admin/window and PUT /admin/config (or /admin/experiment); windows are
    merged, each replica's switchback blocks labelled with its URL. A replica that does not answer is marked degraded
    and left out (its window, its writes) until it answers again; the controller's per-tick version check re-applies
    the config to it then."""

    def __init__(self, urls: Sequence[str], token: str | None, timeout_seconds: float = 10.0):
        if not urls:
            raise ValueError("at least one engine URL is needed")
        self.urls = [url.rstrip("/") for url in urls]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(headers=headers, timeout=timeout_seconds)
        self.degraded: dict[str, str] = {}
        self._applied: EngineConfig | Experiment | None = None   # the last change every answering replica took

    def _call(self, method: str, url: str, **kwargs) -> dict:
        try:
            reply = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as error:
            raise Unreachable(f"{url}: {error}") from error
        if reply.status_code != 200:
            raise EngineClientError(f"{method} {url}: HTTP {reply.status_code}: {reply.text[:300]}")
        return reply.json()

    def _each(self, method: str, path: str, **kwargs) -> dict[str, dict]:
        """Call every replica; those that do not answer are marked degraded. Raises if none answers."""
        replies = {}
        for url in self.urls:
            try:
                replies[url] = self._call(method, f"{url}{path}", **kwargs)
                self.degraded.pop(url, None)
            except Unreachable as error:
                self.degraded[url] = str(error)
        if not replies:
            raise EngineClientError("no engine replica answers: " + "; ".join(self.degraded.values()))
        return replies

    def windows(self) -> dict[str, Window]:
        """Each answering replica's window, closed now (snapshot() is their merge)."""
        replies = self._each("GET", f"/admin/window?reader={READER}")
        return {url: window_from_dict(reply, url) for url, reply in replies.items()}

    def snapshot(self) -> Window:
        return merge_windows(list(self.windows().values()))

    def check(self, config: EngineConfig) -> None:
        self._each("POST", "/admin/config/check", content=config.model_dump_json())

    def apply(self, change: EngineConfig | Experiment) -> None:
        """Checked on every replica first (an Experiment's two configs both); if one still fails, those already
        changed get the previous change back."""
        for config in (change.incumbent, change.candidate) if isinstance(change, Experiment) else (change,):
            self.check(config)
        self.apply_each({url: change for url in self.urls}, change)

    def apply_each(self, changes: dict[str, EngineConfig | Experiment], whole: EngineConfig | Experiment) -> None:
        """Each answering replica its own change (checked already); whole: what the fleet then runs, given back to
        those changed if a later replica fails half way."""
        changed = []
        try:
            for url, change in changes.items():
                if url in self.degraded:
                    continue
                try:
                    self._put(url, change)
                except Unreachable as error:
                    self.degraded[url] = str(error)
                    continue
                changed.append(url)
        except EngineClientError:
            self._undo(changed)
            raise
        if not changed:
            raise EngineClientError("no engine replica answers: " + "; ".join(self.degraded.values()))
        self._applied = whole

    def _put(self, url: str, change: EngineConfig | Experiment) -> None:
        """PUT /admin/experiment for an Experiment, PUT /admin/config for a config (which ends a running one)."""
        path = "experiment" if isinstance(change, Experiment) else "config"
        self._call("PUT", f"{url}/admin/{path}", content=change.model_dump_json())

    def _undo(self, urls: list[str]) -> None:
        if self._applied is None:
            return
        for url in urls:
            try:
                self._put(url, self._applied)
            except EngineClientError as error:
                self.degraded[url] = f"could not restore {_described(self._applied)}: {error}"

    def versions(self) -> dict[str, int]:
        return {url: reply["version"] for url, reply in self._each("GET", "/admin/config").items()}

    def config(self) -> EngineConfig:
        return EngineConfig.model_validate(self._call("GET", f"{self.urls[0]}/admin/config"))


def _described(change: EngineConfig | Experiment) -> str:
    if isinstance(change, Experiment):
        return f"the experiment v{change.incumbent.version} vs v{change.candidate.version}"
    return f"v{change.version}"
