"""Drives one Engine from a background thread; asyncio callers submit requests and stream emissions.

A step that fails ends every request in flight with a Failure (the API answers 5xx). With expert parallelism, a
failed step or a dead rank makes the thread tear the group down and respawn it (engine.respawn); meanwhile new
requests are refused as unavailable, and once respawns keep failing the service gives up and calls on_fatal.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable

from engine.engine import Engine
from engine.respawn import GroupRecovery, RespawnsExhausted
from engine.runtime.delivery import Emission, Failure
from engine.server.admission import Admission
from seam import SamplingParams

log = logging.getLogger(__name__)
STALL_SECONDS = 30.0      # no step for this long while work waits: the engine is reported stuck
FAILING_STEPS = 3         # steps failed in a row, none served between: the engine is reported failing
RETRY_AFTER_SECONDS = 5


class Unavailable(RuntimeError):
    """The service refuses new requests for now (recovering or stopped); retry_after: seconds, or None."""

    def __init__(self, reason: str, retry_after: int | None):
        super().__init__(reason)
        self.retry_after = retry_after


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
    def __init__(self, engine: Engine, idle_wait_seconds: float = 0.05, admission: Admission | None = None,
                 recovery: GroupRecovery | None = None, on_fatal: Callable[[str], None] | None = None,
                 stall_seconds: float = STALL_SECONDS):
        self.engine, self.recovery = engine, recovery
        self.admission = admission or Admission()
        self._on_fatal = on_fatal or (lambda reason: None)
        self._idle_wait, self._stall_seconds = idle_wait_seconds, stall_seconds
        self._inbox: queue.Queue = queue.Queue()
        self._listeners: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="governor-engine", daemon=True)
        self._heartbeat = time.monotonic()
        self.fatal: str | None = None
        self._failed_steps, self._step_error = 0, ""

    def start(self) -> None:
        self._heartbeat = time.monotonic()
        self._thread.start()

    def fault(self) -> str | None:
        """Why the engine cannot serve now, or None: the health probe of the 'engine' component. Steps that fail in a
        row count too: every request then fails, though the thread runs."""
        return self._stopped_or_stuck() or self._failing()

    def _failing(self) -> str | None:
        if self._failed_steps < FAILING_STEPS:
            return None
        return f"the last {self._failed_steps} engine steps failed, the latest with: {self._step_error}"

    def _stopped_or_stuck(self) -> str | None:
        if self.fatal is not None:
            return f"the engine gave up: {self.fatal}"
        if not self._thread.is_alive():
            return "the engine thread is not running" if self._thread.ident is None else "the engine thread died"
        waiting = self.engine.has_work or not self._inbox.empty()
        silent = time.monotonic() - self._heartbeat
        if waiting and silent > self._stall_seconds and (self.recovery is None or self.recovery.fault() is None):
            return f"no engine step for {silent:.0f} s while requests wait"
        return None

    def group_fault(self) -> str | None:
        """The 'expert_parallel' component's probe: a dead rank, or a respawn under way."""
        return self.recovery.fault() if self.recovery is not None else None

    def unavailable(self) -> Unavailable | None:
        """Why a new request would be refused now, or None. Not failing steps: a request is the step that shows the
        cause gone (say, an operator's new config), and one that fails gets its 5xx."""
        reason = self._stopped_or_stuck()
        if reason is not None:
            return Unavailable(reason, None if self.fatal else RETRY_AFTER_SECONDS)
        reason = self.group_fault()
        return Unavailable(reason, RETRY_AFTER_SECONDS) if reason is not None else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Submission:
        """Admit the request and queue it for the engine; raises RequestError, Unavailable (while the service
        cannot take requests) or admission.Overloaded, queuing nothing. Call from the event loop that will read its
        emissions."""
        self.engine.check_request(prompt_ids, params)
        refusal = self.unavailable()
        if refusal is not None:
            raise refusal
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
        try:
            while not self._stop.is_set():
                self._heartbeat = time.monotonic()
                fault = self.group_fault()
                if fault is not None:
                    self._fail_in_flight(Failure("expert_parallel_rank_failed", fault, retryable=True))
                    self._recover(fault)
                    continue
                self._drain_inbox(block=not self.engine.has_work)
                if self.engine.has_work:
                    self._step()
        except RespawnsExhausted as error:
            self.fatal = str(error)
            log.critical("%s; the service stops so that its supervisor restarts it", error)
            self._fail_in_flight(Failure("engine_stopped", str(error)))
            self._on_fatal(str(error))

    def _step(self) -> None:
        try:
            emissions = self.engine.step()
        except Exception as error:
            log.exception("engine step failed; failing every request in flight")
            self._failed_steps, self._step_error = self._failed_steps + 1, f"{type(error).__name__}: {error}"
            recoverable = self.recovery is not None
            self._fail_in_flight(Failure(getattr(error, "cause", "engine_step_failed"), str(error), recoverable))
            if recoverable:
                self._recover(str(error))   # a worker may be stuck half way through the forward: start afresh
            return
        self._failed_steps = 0
        for emission in emissions:
            self._publish(emission)

    def _recover(self, reason: str) -> None:
        self.recovery.recover(reason)
        self._heartbeat = time.monotonic()

    def _fail_in_flight(self, failure: Failure) -> None:
        for emission in self.engine.fail_all(failure):
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
