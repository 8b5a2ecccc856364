"""A controller that leads only while it holds the lease (controller/lease.py): two `governor control` processes on
the same engines and database, one acting, the other observing and ready to take over. On taking the lease the
controller takes charge from the store (the dead leader's open trial is reverted and recorded as interrupted); on
losing it, it forgets its trial and writes nothing (its writes are fenced by the lease epoch)."""
from __future__ import annotations

import logging
import threading

from controller.alerts import AlertIntake
from controller.lease import Lease
from controller.loop import Controller

log = logging.getLogger("governor.standby")


class LeaderLoop:
    """Runs in place of Controller.start(): every tick, tick the controller if this process leads."""

    def __init__(self, controller: Controller, lease: Lease, intake: AlertIntake):
        self.controller, self.lease, self.intake = controller, lease, intake
        self._led: int | None = None          # the epoch this process took charge under
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.lease.start()
        self._thread = threading.Thread(target=self._run, name="governor-leader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.lease.stop()

    def fault(self) -> str | None:
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            return "the controller thread died"
        return None

    def _run(self) -> None:
        window = self.controller.policy.window
        while not self._stop.wait(window.seconds / window.checks):
            try:
                self.tick()
            except Exception:
                log.exception("controller tick failed; the next tick starts afresh")
            window = self.controller.policy.window

    def tick(self) -> None:
        epoch = self.lease.leading_epoch()
        if epoch != self._led:
            if self._led is not None:
                log.warning("lease lost (epoch %d): standing by", self._led)
                self.controller.step_down()
                self._led = None
            if epoch is not None:
                self.controller.take_over()
                self._led = epoch
        if epoch is None:
            self.controller.observe()
            return
        self.intake.act_on_deferred()
        self.controller.tick()
