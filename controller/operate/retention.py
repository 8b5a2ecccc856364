"""Retention: a background sweep that prunes the store's decisions, trials and windows (recorded as decision inputs)
older than the policy's retention, keeping every config version that last-known-good, a pin, the config in use or a
remaining record needs."""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from controller.loop import Controller
from controller.periodic import Periodic
from controller.store import AlertOutcome, ConfigVersion, Decision, Rollback, StateEntry, Store, Trial

log = logging.getLogger("governor.retention")
SWEEP_SECONDS = 3600.0


class RetentionSweeper:
    def __init__(self, controller: Controller, days: float, leading: Callable[[], bool] = lambda: True,
                 every_seconds: float = SWEEP_SECONDS):
        """days: how long records are kept; 0 keeps everything (the sweeper then does nothing). leading: whether
        this process leads (a standby sweeps nothing)."""
        self.controller, self.days, self.leading, self.every_seconds = controller, days, leading, every_seconds
        self._sweeps = Periodic("governor-retention", self.sweep, lambda: self.every_seconds, first_at_once=True)

    def sweep(self, now: dt.datetime | None = None) -> dict[str, int]:
        if self.days <= 0 or not self.leading():
            return {}
        now = now or dt.datetime.now(dt.timezone.utc)
        controller = self.controller
        with controller.lock:
            deleted = prune(controller.store, now - dt.timedelta(days=self.days),
                            keep_versions={controller.current.version, controller.last_known_good.version})
        if any(deleted.values()):
            log.info("retention (%g days) pruned %s", self.days, deleted)
        return deleted

    def start(self) -> None:
        if self.days > 0:
            self._sweeps.start()

    def stop(self) -> None:
        self._sweeps.stop()


def prune(store: Store, before: dt.datetime, keep_versions: set[int] = frozenset()) -> dict[str, int]:
    """Delete decisions, rollbacks and finished trials recorded before `before`, then config versions that are
    older and nothing left refers to. Never deleted: the last-known-good, the pinned and the newest version,
    keep_versions (e.g. the config in use), and alerts and their outcomes (they make a redelivery act only
    once; an outcome loses the link to a pruned decision).
    Returns the rows deleted per table."""
    with store.write() as session:
        old_decisions = select(Decision.id).where(Decision.at < before)
        session.execute(update(AlertOutcome).where(AlertOutcome.decision_id.in_(old_decisions))
                        .values(decision_id=None))
        rollbacks = session.execute(delete(Rollback).where(
            or_(Rollback.at < before, Rollback.decision_id.in_(old_decisions)))).rowcount
        decisions = session.execute(delete(Decision).where(Decision.at < before)).rowcount
        trials = session.execute(delete(Trial).where(
            Trial.started_at < before, Trial.outcome != "running",
            Trial.id.not_in(select(Decision.trial_id).where(Decision.trial_id.is_not(None))))).rowcount
        keep = set(keep_versions) | _held_versions(session)
        newest = session.scalar(select(func.max(ConfigVersion.id)))
        referenced = [select(column).where(column.is_not(None)) for column in (
            Decision.config_version, Trial.config_version, Trial.baseline_version, Rollback.from_version,
            Rollback.to_version)]
        query = delete(ConfigVersion).where(ConfigVersion.at < before, ConfigVersion.id.not_in(keep | {newest}))
        for refs in referenced:
            query = query.where(ConfigVersion.id.not_in(refs))
        versions = session.execute(query).rowcount
    return {"decisions": decisions, "rollbacks": rollbacks, "trials": trials, "config_versions": versions}


def _held_versions(session: Session) -> set[int]:
    """The versions the last-known-good and the pin name."""
    lkg, pin = session.get(StateEntry, "last_known_good"), session.get(StateEntry, "pin")
    return {version for version in (lkg and lkg.value["version"], pin and pin.value["config_version"]) if version}
