"""Drives one Engine from a background thread; asyncio callers submit requests and stream emissions."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator

from engine.admission import Admission
from engine.engine import Emission, Engine
from seam import SamplingParams

log = logging.getLogger(__name__)


class Submission:
    """One request handed to the engine: its emissions, and cancel() for a caller that stops listening."""

    def __init__(self, service: EngineService, request_id: str, inbox: asyncio.Queue):
        self._service, self.request_id, self._inbox = service, request_id, inbox
        self._done = False

    async def emissions(self) -> AsyncIterator[Emission]:
        """Leaving early (e.g. a client disconnect) cancels the request."""
        try:
            while not self._done:
                emission = await self._inbox.get()
                self._done = emission.finish_reason is not None
                yield emission
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Abort the request unless it has finished; idempotent. Its KV blocks return to the pool."""
        if not self._done:
            self._done = True
            self._service._cancel(self.request_id)


class EngineService:
    def __init__(self, engine: Engine, idle_wait_seconds: float = 0.05, admission: Admission | None = None):
        self.engine = engine
        self.admission = admission or Admission()
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

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Submission:
        """Admit the request and queue it for the engine; raises RequestError or admission.Overloaded, queuing
        nothing. Call from the event loop that will read its emissions."""
        self.engine.check_request(prompt_ids, params)
        request_id = uuid.uuid4().hex
        self.admission.admit(request_id, len(prompt_ids))
        inbox: asyncio.Queue = asyncio.Queue()
        self._listeners[request_id] = (asyncio.get_running_loop(), inbox)
        self._inbox.put(("add", request_id, prompt_ids, params))
        return Submission(self, request_id, inbox)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[Emission]:
        """Stream a request's emissions; leaving early cancels it."""
        async for emission in self.submit(prompt_ids, params).emissions():
            yield emission

    def _cancel(self, request_id: str) -> None:
        self._listeners.pop(request_id, None)
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
            self.admission.started(command[1])
            return
        _, request_id, prompt_ids, params = command
        if request_id in self._listeners:
            self.engine.add_request(request_id, prompt_ids, params)
        else:
            self.admission.started(request_id)

    def _publish(self, emission: Emission) -> None:
        self.admission.started(emission.request_id)
        if emission.finish_reason is not None:
            listener = self._listeners.pop(emission.request_id, None)
        else:
            listener = self._listeners.get(emission.request_id)
        if listener is not None:
            loop, inbox = listener
            loop.call_soon_threadsafe(inbox.put_nowait, emission)
