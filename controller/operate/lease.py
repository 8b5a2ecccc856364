"""The leader lease: of the controller processes on one database, the one holding the lease acts; the others stand
by and observe. Works on SQLite (one machine) and PostgreSQL alike, with plain row updates.

One row per lease name: holder, epoch (raised on every change of holder) and a renewal count. The holder renews every
third of `duration`; a candidate that has seen the row unchanged for a whole `duration` (on its own monotonic clock,
so the clocks of different machines are never compared) takes it over with a compare-and-swap on (epoch, renewals).
A holder that stops cleanly releases the lease, and a candidate takes a released one at once.

Fencing: the holder's store writes first touch the lease row where holder and epoch are still its own (which also
holds off a takeover until that write commits) and commit nothing once the lease has moved on (LeaseLost)."""
from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from sqlalchemy import Integer, String, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Mapped, Session, mapped_column

from controller.periodic import Periodic
from controller.store import Base, Store

log = logging.getLogger("governor.lease")
RELEASED = ""       # the holder of a lease nobody holds


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class LeaseRow(Base):
    __tablename__ = "governor_leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(Integer)
    renewals: Mapped[int] = mapped_column(Integer)
    renewed_at: Mapped[dt.datetime] = mapped_column(default=_now, onupdate=_now)    # for people; never compared


class LeaseLost(RuntimeError):
    """A write by a process that no longer holds the lease: nothing of it was committed."""


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    def __init__(self, store: Store, duration: Callable[[], float], holder: str | None = None,
                 name: str = "controller"):
        """duration: seconds without a renewal after which a candidate takes the lease (read at every step)."""
        store.create_tables([LeaseRow.__table__])
        self.store, self.duration, self.name = store, duration, name
        self.holder = holder or default_holder()
        self.leader: str | None = None          # the holder last seen
        self._epoch: int | None = None          # ours, while we hold it
        self._valid_until = float("-inf")      # monotonic: past this, we do not act on it without renewing
        self._seen: tuple[str, int, int] | None = None
        self._seen_at = time.monotonic()
        self._lock = threading.Lock()
        self._renewals = Periodic("governor-lease", self._step_logging_outages, lambda: self.duration() / 3)
        store.fence = self.fence

    # -- what the controller asks ----------------------------------------------------------------------------------

    def leading_epoch(self) -> int | None:
        """Our epoch while we hold the lease and last renewed it less than `duration` ago, else None."""
        with self._lock:
            return self._epoch if time.monotonic() < self._valid_until else None

    def leading(self) -> bool:
        return self.leading_epoch() is not None

    def fence(self, session: Session) -> None:
        epoch = self._epoch
        if epoch is None or session.execute(
                update(LeaseRow).where(LeaseRow.name == self.name, LeaseRow.holder == self.holder,
                                       LeaseRow.epoch == epoch).values(renewals=LeaseRow.renewals)).rowcount != 1:
            raise LeaseLost(f"{self.holder} does not hold the {self.name!r} lease (leader: {self.leader}); "
                            "nothing written")

    def state(self) -> dict:
        epoch = self.leading_epoch()
        return {"role": "leader" if epoch is not None else "standby", "holder": self.holder, "leader": self.leader,
                "epoch": epoch}

    # -- renewing and taking over ----------------------------------------------------------------------------------

    def start(self) -> None:
        self.step()
        self._renewals.start()

    def stop(self) -> None:
        """Stop renewing and release the lease, so that a standby takes over at once."""
        self._renewals.stop()
        with self._lock:
            epoch, self._epoch, self._valid_until = self._epoch, None, float("-inf")
        if epoch is not None:
            with Session(self.store.engine) as session, session.begin():
                session.execute(update(LeaseRow).where(LeaseRow.name == self.name, LeaseRow.holder == self.holder,
                                                       LeaseRow.epoch == epoch)
                                .values(holder=RELEASED, renewals=LeaseRow.renewals + 1))

    def _step_logging_outages(self) -> None:
        """A step; a database that does not answer is a warning (the lease lapses if it lasts), not a failure."""
        try:
            self.step()
        except SQLAlchemyError as error:
            log.warning("lease %r: the database did not answer: %s", self.name, str(error).splitlines()[0])

    def step(self) -> None:
        """Renew the lease if we hold it; else watch it, and take it once it is released or left unrenewed."""
        started = time.monotonic()
        with Session(self.store.engine) as session:
            row = session.scalars(select(LeaseRow).where(LeaseRow.name == self.name)).first()
            seen = None if row is None else (row.holder, row.epoch, row.renewals)
        if seen is None:
            self._claim(started, None)
        elif seen[0] == self.holder and seen[1] == self._epoch:
            self._renew(started, seen)
        else:
            self._lose(seen[0])
            if seen != self._seen:
                self._seen, self._seen_at = seen, started
            if seen[0] == RELEASED or started - self._seen_at >= self.duration():
                self._claim(started, seen)

    def _renew(self, started: float, seen: tuple[str, int, int]) -> None:
        if self._swap(seen, {"renewals": seen[2] + 1}):
            with self._lock:
                self._valid_until = started + self.duration()
        else:
            self._lose(None)

    def _claim(self, started: float, seen: tuple[str, int, int] | None) -> None:
        epoch = 1 if seen is None else seen[1] + 1
        if seen is None:
            try:
                with Session(self.store.engine) as session, session.begin():
                    session.add(LeaseRow(name=self.name, holder=self.holder, epoch=epoch, renewals=0))
            except IntegrityError:
                return      # another candidate made the row first
        elif not self._swap(seen, {"holder": self.holder, "epoch": epoch, "renewals": 0}):
            return
        with self._lock:
            self._epoch, self._valid_until, self.leader = epoch, started + self.duration(), self.holder
        log.info("lease %r: %s leads (epoch %d)", self.name, self.holder, epoch)

    def _swap(self, seen: tuple[str, int, int], values: dict) -> bool:
        """Compare-and-swap: update the row only if it is still as seen."""
        holder, epoch, renewals = seen
        with Session(self.store.engine) as session, session.begin():
            return session.execute(update(LeaseRow).where(
                LeaseRow.name == self.name, LeaseRow.holder == holder, LeaseRow.epoch == epoch,
                LeaseRow.renewals == renewals).values(**values)).rowcount == 1

    def _lose(self, leader: str | None) -> None:
        with self._lock:
            if self._epoch is not None:
                log.warning("lease %r: %s no longer leads", self.name, self.holder)
            self._epoch, self._valid_until = None, float("-inf")
            if leader is not None:
                self.leader = leader or None
