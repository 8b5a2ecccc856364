"""A daemon thread that calls one piece of work at an interval: the controller's background jobs (the reconcile loop,
the leader lease, the standby's watch, retention) each run on one."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("governor.controller")


class Periodic:
    def __init__(self, name: str, work: Callable[[], object], interval: Callable[[], float],
                 first_at_once: bool = False):
        """interval: seconds to wait before each call (read before every wait); first_at_once: call once before
        the first wait. An exception from work is logged and the next call goes ahead."""
        self.name, self.work, self.interval, self.first_at_once = name, work, interval, first_at_once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def died(self) -> bool:
        """The thread ended without being stopped (it was never started: False)."""
        return self._thread is not None and not self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        if self.first_at_once:
            self._call()
        while not self._stop.wait(self.interval()):
            self._call()

    def _call(self) -> None:
        try:
            self.work()
        except Exception:
            log.exception("%s failed; the next run tries again", self.name)
