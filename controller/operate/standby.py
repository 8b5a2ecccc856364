"""A controller that leads only while it holds the lease (controller/operate/lease.py): two `governor control` processes
on the same engines and database, one acting, the other observing and ready to take over. On taking the lease the
controller takes charge from the store (the dead leader's open trial is reverted and recorded as interrupted); on
losing it, it forgets its trial and writes nothing (its writes are fenced by the lease epoch)."""
from __future__ import annotations

import logging

from controller.loop import Controller
from controller.operate.alerts import AlertIntake
from controller.operate.lease import Lease
from controller.periodic import Periodic

log = logging.getLogger("governor.standby")


class LeaderLoop:
    """Runs in place of Controller.start(): every tick, tick the controller if this process leads."""

    def __init__(self, controller: Controller, lease: Lease, intake: AlertIntake):
        self.controller, self.lease, self.intake = controller, lease, intake
        self._led: int | None = None          # the epoch this process took charge under
        self._ticks = Periodic("governor-leader", self.tick, controller.check_seconds)

    def start(self) -> None:
        self.lease.start()
        self._ticks.start()

    def stop(self) -> None:
        self._ticks.stop()
        self.lease.stop()

    def fault(self) -> str | None:
        return "the controller thread died" if self._ticks.died() else None

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
