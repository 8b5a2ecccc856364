"""`governor serve` with faults injected, for tests only (the product ships no such knob):

    python -m tests.e2e.injected_serve serve ...

- GOVERNOR_TEST_SLOW_STEPS_FILE=PATH: while PATH exists, every engine step first sleeps SLOW_STEP_SECONDS.
- GOVERNOR_TEST_KILL_BEFORE=rollback: the process kills itself (SIGKILL) when an operator action is about to roll back,
  i.e. after an alert was recorded and before it was acted on.
- GOVERNOR_TEST_FAIL_RESPAWNS=1: every respawn of the expert-parallel group fails (its new group never starts).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import engine.respawn
from controller.operate.actions import Operator
from engine.engine import Engine
from engine.moe.ep import ExpertParallelError
from governor.cli import main

SLOW_STEP_SECONDS = 0.6


def _slow_steps(flag: Path) -> None:
    step = Engine.step

    def slowed(self):
        if flag.exists():
            time.sleep(SLOW_STEP_SECONDS)
        return step(self)
    Engine.step = slowed


def _kill_before(action: str) -> None:
    def killed(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    setattr(Operator, action, killed)


def _fail_respawns() -> None:
    def refuse(*args, **kwargs):
        raise ExpertParallelError("injected: the respawned group does not start")
    engine.respawn.ExpertParallel = refuse


if __name__ == "__main__":
    if "GOVERNOR_TEST_SLOW_STEPS_FILE" in os.environ:
        _slow_steps(Path(os.environ["GOVERNOR_TEST_SLOW_STEPS_FILE"]))
    if "GOVERNOR_TEST_KILL_BEFORE" in os.environ:
        _kill_before(os.environ["GOVERNOR_TEST_KILL_BEFORE"])
    if os.environ.get("GOVERNOR_TEST_FAIL_RESPAWNS") == "1":
        _fail_respawns()
    sys.exit(main())
