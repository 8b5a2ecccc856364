"""Retention: a background sweep that prunes the store's decisions, trials and windows (recorded as decision inputs)
older than the policy's retention, keeping every config version that last-known-good, a pin, the config in use or a
remaining record needs."""
from __future__ import annotations

import datetime as dt
import logging
import threading

from controller.loop import Controller

log = logging.getLogger("governor.retention")
SWEEP_SECONDS = 3600.0


class RetentionSweeper:
    def __init__(self, controller: Controller, days: float, every_seconds: float = SWEEP_SECONDS):
        """days: how long records are kept; 0 keeps everything (the sweeper then does nothing)."""
        self.controller, self.days, self.every_seconds = controller, days, every_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self, now: dt.datetime | None = None) -> dict[str, int]:
        if self.days <= 0:
            return {}
        now = now or dt.datetime.now(dt.timezone.utc)
        controller = self.controller
        with controller.lock:
            deleted = controller.store.prune(now - dt.timedelta(days=self.days),
                                             keep_versions={controller.current.version,
                                                            controller.last_known_good.version})
        if any(deleted.values()):
            log.info("retention (%g days) pruned %s", self.days, deleted)
        return deleted

    def start(self) -> None:
        if self.days > 0:
            self._thread = threading.Thread(target=self._run, name="governor-retention", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            try:
                self.sweep()
            except Exception:
                log.exception("retention sweep failed; the next one tries again")
            if self._stop.wait(self.every_seconds):
                return
