"""Drives one Engine from a background thread; asyncio callers submit requests and stream emissions."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator

from engine.engine import Emission, Engine
from seam import SamplingParams

log = logging.getLogger(__name__)


class EngineService:
    def __init__(self, engine: Engine, idle_wait_seconds: float = 0.05):
        self.engine = engine
        self._idle_wait = idle_wait_seconds
        self._inbox: queue.Queue = queue.Queue()
        self._listeners: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="governor-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[Emission]:
        """Stream a request's emissions; leaving early (e.g. a client disconnect) cancels it."""
        self.engine.check_request(prompt_ids, params)
        request_id = uuid.uuid4().hex
        inbox: asyncio.Queue = asyncio.Queue()
        self._listeners[request_id] = (asyncio.get_running_loop(), inbox)
        self._inbox.put(("add", request_id, prompt_ids, params))
        finished = False
        try:
            while not finished:
                emission = await inbox.get()
                finished = emission.finish_reason is not None
                yield emission
        finally:
            self._listeners.pop(request_id, None)
            if not finished:
                self._inbox.put(("abort", request_id))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain_inbox(block=not self.engine.has_work)
            if not self.engine.has_work:
                continue
            try:
                emissions = self.engine.step()
            except Exception:
                log.exception("engine step failed; failing every request in flight")
                emissions = self.engine.fail_all()
            for emission in emissions:
                self._publish(emission)

    def _drain_inbox(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=self._idle_wait) if block else self._inbox.get_nowait()
            while True:
                self._execute(command)
                command = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _execute(self, command: tuple) -> None:
        if command[0] == "abort":
            self.engine.abort(command[1])
            return
        _, request_id, prompt_ids, params = command
        if request_id in self._listeners:
            self.engine.add_request(request_id, prompt_ids, params)

    def _publish(self, emission: Emission) -> None:
        listener = self._listeners.get(emission.request_id)
        if listener is not None:
            loop, inbox = listener
            loop.call_soon_threadsafe(inbox.put_nowait, emission)
