"""The controller's durable record (SQLAlchemy 2.x, on SQLite or PostgreSQL by URL): config versions with diffs,
trials, decisions, alerts, rollbacks, and the last-known-good config. Every write commits at once, so a kill -9 loses
nothing recorded. Writers on several connections (two controller processes) are safe: alerts are deduplicated by a
unique key, a trial is finished once, and config versions are numbered and diffed one writer at a time. A controller
that leads by a lease sets `fence`: its writes then commit only while it still holds the lease."""
from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, UniqueConstraint, create_engine, \
    event, select, text, update
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError, ProgrammingError, \
    SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from controller.outcomes import Action, TrialOutcome
from seam import EngineConfig, strict_json


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict: JSON, list: JSON, dt.datetime: DateTime(timezone=True)}


class ConfigVersion(Base):
    __tablename__ = "governor_config_versions"
    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(default=_now)
    config: Mapped[dict]
    diff: Mapped[dict]            # field -> [before, after] against the previous version
    source: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(500))


class Trial(Base):
    __tablename__ = "governor_trials"
    id: Mapped[int] = mapped_column(primary_key=True)
    started_at: Mapped[dt.datetime] = mapped_column(default=_now)
    ended_at: Mapped[dt.datetime | None]
    policy: Mapped[str] = mapped_column(String(16))
    config_version: Mapped[int] = mapped_column(ForeignKey("governor_config_versions.id"))
    baseline_version: Mapped[int] = mapped_column(ForeignKey("governor_config_versions.id"))
    outcome: Mapped[str] = mapped_column(String(16), default="running")
    predicted_gain: Mapped[float | None] = mapped_column(Float)
    measured_gain: Mapped[float | None] = mapped_column(Float)
    optuna_trial: Mapped[int | None] = mapped_column(Integer)


class Decision(Base):
    __tablename__ = "governor_decisions"
    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(default=_now)
    action: Mapped[str] = mapped_column(String(32), index=True)
    reason: Mapped[str] = mapped_column(String(1000))
    inputs: Mapped[dict]
    predicted_gain: Mapped[float | None] = mapped_column(Float)
    measured_gain: Mapped[float | None] = mapped_column(Float)
    config_version: Mapped[int | None] = mapped_column(ForeignKey("governor_config_versions.id"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("governor_trials.id"))


class AlertRecord(Base):
    __tablename__ = "governor_alerts"
    __table_args__ = (UniqueConstraint("fingerprint", "starts_at", "status"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    received_at: Mapped[dt.datetime] = mapped_column(default=_now)
    fingerprint: Mapped[str] = mapped_column(String(128))
    starts_at: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(32))
    labels: Mapped[dict]
    annotations: Mapped[dict]
    source: Mapped[str] = mapped_column(String(32))


class AlertOutcome(Base):
    """What became of an alert notification's action: acted or skipped (settled: a redelivery is a no-op), failed
    (a redelivery acts again). A notification with no outcome was recorded but not acted on (e.g. a kill -9)."""
    __tablename__ = "governor_alert_outcomes"
    alert_id: Mapped[int] = mapped_column(ForeignKey("governor_alerts.id"), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(String(1000))
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("governor_decisions.id"))
    updated_at: Mapped[dt.datetime] = mapped_column(default=_now, onupdate=_now)


SETTLED = ("acted", "skipped")


class Rollback(Base):
    __tablename__ = "governor_rollbacks"
    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(default=_now)
    reason: Mapped[str] = mapped_column(String(1000))
    from_version: Mapped[int | None] = mapped_column(ForeignKey("governor_config_versions.id"))
    to_version: Mapped[int] = mapped_column(ForeignKey("governor_config_versions.id"))
    decision_id: Mapped[int] = mapped_column(ForeignKey("governor_decisions.id"))


class StateEntry(Base):
    __tablename__ = "governor_state"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict]
    updated_at: Mapped[dt.datetime] = mapped_column(default=_now, onupdate=_now)


@dataclass(frozen=True)
class Pin:
    config_version: int
    owner: str          # "operator" or "alert:<fingerprint>"
    reason: str


def config_diff(before: dict | None, after: dict) -> dict:
    before = before or {}
    return {key: [before.get(key), value] for key, value in after.items()
            if key != "version" and before.get(key) != value}


@dataclass(frozen=True)
class RollbackRow:
    reason: str
    from_version: int | None
    to_version: int


class StoreError(RuntimeError):
    """The database URL cannot be used; the message names the URL and why."""


WRITE_CHECK_SECONDS = 2.0   # /health writes to the store at most this often
SCHEMA_LOCK = 0x60E4        # the PostgreSQL advisory lock key under which the first start creates the tables
CONFIG_LOCK = "lock:config_versions"    # the state row whose update serializes the writers of config versions


class Store:
    def __init__(self, url: str):
        self.url = url
        self._write_checked: tuple[float, str | None] = (float("-inf"), None)
        self.fence: Callable[[Session], None] | None = None    # raises inside a write that must not commit
        try:
            self.engine = create_engine(url, json_serializer=lambda v: strict_json.dumps(v, default=str),
                                        json_deserializer=strict_json.loads,
                                        pool_pre_ping=not url.startswith("sqlite"))
            if url.startswith("sqlite"):
                event.listen(self.engine, "connect", _sqlite_pragmas)
            self.create_tables(Base.metadata.sorted_tables)
            self._ensure_state(CONFIG_LOCK)
        except (ArgumentError, NoSuchModuleError, OperationalError) as error:
            raise StoreError(f"{url}: {str(error).splitlines()[0]}") from None

    def create_tables(self, tables) -> None:
        """Create the missing tables; two processes starting at once create them once (PostgreSQL: under an
        advisory lock; SQLite: the loser of the race looks again and finds them made)."""
        for attempt in range(3):
            try:
                with self.engine.begin() as connection:
                    if connection.dialect.name == "postgresql":
                        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK})
                    Base.metadata.create_all(connection, tables=tables)
                return
            except (OperationalError, ProgrammingError) as error:
                if "already exists" not in str(error) or attempt == 2:
                    raise

    def _ensure_state(self, key: str) -> None:
        try:
            with Session(self.engine) as session, session.begin():
                if session.get(StateEntry, key) is None:
                    session.add(StateEntry(key=key, value={}))
        except IntegrityError:
            pass        # another writer made it first

    @contextmanager
    def write(self, fenced: bool = True) -> Iterator[Session]:
        """One committed transaction; fenced writes first pass the fence (a lease holder's), or commit nothing."""
        with Session(self.engine) as session, session.begin():
            if fenced and self.fence is not None:
                self.fence(session)
            yield session

    def close(self) -> None:
        self.engine.dispose()

    def fault(self) -> str | None:
        """None if a write commits (checked at most every WRITE_CHECK_SECONDS), else why it does not."""
        checked_at, fault = self._write_checked
        if time.monotonic() - checked_at < WRITE_CHECK_SECONDS:
            return fault
        try:
            self._set_state("write_check", {"at": _now().isoformat()}, fenced=False)
            fault = None
        except SQLAlchemyError as error:
            fault = f"the store cannot be written: {str(error).splitlines()[0]}"
        self._write_checked = (time.monotonic(), fault)
        return fault

    def _add(self, row: Base, fenced: bool = True) -> int:
        with self.write(fenced) as session:
            session.add(row)
            session.flush()
            return row.id

    # -- config versions and the last known good ---------------------------------------------------------------

    def record_config(self, config: EngineConfig, source: str, reason: str) -> EngineConfig:
        """Store config as a new version; returns it stamped with that version number."""
        with self.write() as session:
            session.execute(update(StateEntry).where(StateEntry.key == CONFIG_LOCK).values(updated_at=_now()))
            previous = session.scalars(select(ConfigVersion).order_by(ConfigVersion.id.desc()).limit(1)).first()
            values = config.model_dump(mode="json")
            row = ConfigVersion(config={}, diff=config_diff(previous.config if previous else None, values),
                                source=source, reason=reason[:500])
            session.add(row)
            session.flush()
            row.config = {**values, "version": row.id}
            return config.changed(version=row.id)

    def config(self, version: int) -> EngineConfig:
        with Session(self.engine) as session:
            return EngineConfig.model_validate(session.get(ConfigVersion, version).config)

    def set_last_known_good(self, config: EngineConfig) -> None:
        self._set_state("last_known_good", {"version": config.version})

    def last_known_good(self) -> EngineConfig | None:
        state = self._state("last_known_good")
        return self.config(state["version"]) if state else None

    # -- pin (a manual override, or an alert's) -----------------------------------------------------------------

    def set_pin(self, pin: Pin | None) -> None:
        self._set_state("pin", None if pin is None else pin.__dict__)

    def pin(self) -> Pin | None:
        state = self._state("pin")
        return Pin(**state) if state else None

    def _set_state(self, key: str, value: dict | None, fenced: bool = True) -> None:
        with self.write(fenced) as session:
            entry = session.get(StateEntry, key)
            if value is None:
                if entry is not None:
                    session.delete(entry)
            elif entry is None:
                session.add(StateEntry(key=key, value=value))
            else:
                entry.value = value

    def _state(self, key: str) -> dict | None:
        with Session(self.engine) as session:
            entry = session.get(StateEntry, key)
            return dict(entry.value) if entry else None

    # -- decisions, trials, rollbacks -------------------------------------------------------------------------

    def record_decision(self, action: Action, reason: str, inputs: dict[str, Any] | None = None,
                        predicted_gain: float | None = None, measured_gain: float | None = None,
                        config_version: int | None = None, trial_id: int | None = None,
                        rollback: RollbackRow | None = None, settles_alert: int | None = None,
                        outcome: str = "acted") -> int:
        """One transaction: the decision, its rollback row and the outcome of the alert it settles, so that a kill
        -9 leaves either all of them or none (and a redelivered alert is then acted on again)."""
        with self.write() as session:
            decision = Decision(action=action, reason=reason[:1000], inputs=inputs or {},
                                predicted_gain=predicted_gain, measured_gain=measured_gain,
                                config_version=config_version, trial_id=trial_id)
            session.add(decision)
            session.flush()
            if rollback is not None:
                session.add(Rollback(reason=rollback.reason[:1000], from_version=rollback.from_version,
                                     to_version=rollback.to_version, decision_id=decision.id))
            if settles_alert is not None:
                _put_outcome(session, settles_alert, outcome, reason, decision.id)
            return decision.id

    def start_trial(self, policy: str, config: EngineConfig, baseline: EngineConfig, predicted_gain: float | None,
                    optuna_trial: int | None = None) -> int:
        return self._add(Trial(policy=policy, config_version=config.version, baseline_version=baseline.version,
                               predicted_gain=predicted_gain, optuna_trial=optuna_trial))

    def finish_trial(self, trial_id: int, outcome: TrialOutcome, measured_gain: float | None) -> bool:
        """False if the trial had already finished (another writer finished it first): it stays as that one left it."""
        with self.write() as session:
            return session.execute(update(Trial).where(Trial.id == trial_id, Trial.outcome == "running").values(
                outcome=outcome, measured_gain=measured_gain, ended_at=_now())).rowcount == 1

    def running_trials(self) -> list[int]:
        with Session(self.engine) as session:
            return list(session.scalars(select(Trial.id).where(Trial.outcome == "running")))

    # -- alerts ------------------------------------------------------------------------------------------------

    def record_alert(self, *, fingerprint: str, starts_at: str, status: str, name: str, action: str, labels: dict,
                     annotations: dict, source: str) -> tuple[int, str | None]:
        """Record one alert notification (once per fingerprint, startsAt and status): its id, and the outcome of its
        action so far (None if never acted on)."""
        key = {"fingerprint": fingerprint, "starts_at": starts_at, "status": status}
        try:
            alert_id = self._add(AlertRecord(**key, name=name[:200], action=action, labels=labels,
                                             annotations=annotations, source=source), fenced=False)
            return alert_id, None
        except IntegrityError:
            with Session(self.engine) as session:
                alert_id = session.scalars(select(AlertRecord.id).filter_by(**key)).one()
                outcome = session.get(AlertOutcome, alert_id)
                return alert_id, None if outcome is None else outcome.outcome

    def alerts(self, limit: int = 100) -> list[dict]:
        """Alert notifications, newest first, each with its action's outcome (None: not acted on yet)."""
        with Session(self.engine) as session:
            query = (select(AlertRecord, AlertOutcome).outerjoin(AlertOutcome, AlertOutcome.alert_id == AlertRecord.id)
                     .order_by(AlertRecord.id.desc()).limit(limit))
            return [{**_as_dict(alert), "outcome": None if outcome is None else outcome.outcome,
                     "outcome_detail": None if outcome is None else outcome.detail,
                     "decision_id": None if outcome is None else outcome.decision_id}
                    for alert, outcome in session.execute(query)]

    def defer_alert(self, alert_id: int, detail: str) -> None:
        """Leave a notification to the leader (outcome 'deferred'), unless its action already ran and did not fail."""
        try:
            with self.write(fenced=False) as session:
                session.execute(update(AlertOutcome).where(AlertOutcome.alert_id == alert_id,
                                                           AlertOutcome.outcome == "failed")
                                .values(outcome="deferred", detail=detail[:1000]))
                if session.get(AlertOutcome, alert_id) is None:
                    session.add(AlertOutcome(alert_id=alert_id, outcome="deferred", detail=detail[:1000]))
        except IntegrityError:
            pass        # the leader settled it meanwhile

    def deferred_alerts(self) -> list[dict]:
        """Notifications a standby received and left to the leader, oldest first."""
        with Session(self.engine) as session:
            query = (select(AlertRecord).join(AlertOutcome, AlertOutcome.alert_id == AlertRecord.id)
                     .where(AlertOutcome.outcome == "deferred").order_by(AlertRecord.id))
            return [_as_dict(alert) for alert in session.scalars(query)]

    def settle_alert(self, alert_id: int, outcome: str, detail: str) -> None:
        """Record an alert outcome that has no decision of its own (skipped without effect, or failed)."""
        with self.write() as session:
            _put_outcome(session, alert_id, outcome, detail, None)

    # -- reads -------------------------------------------------------------------------------------------------

    def rows(self, table: type[Base], limit: int = 100, **equal: Any) -> list[dict]:
        """Newest first, as plain dicts."""
        with Session(self.engine) as session:
            query = select(table).filter_by(**equal).order_by(table.__mapper__.primary_key[0].desc()).limit(limit)
            return [_as_dict(row) for row in session.scalars(query)]

    def decisions(self, limit: int = 100, **equal: Any) -> list[dict]:
        return self.rows(Decision, limit, **equal)

    def config_versions(self, limit: int = 100) -> list[dict]:
        return self.rows(ConfigVersion, limit)

    def trials(self, limit: int = 100) -> list[dict]:
        return self.rows(Trial, limit)

    def count(self, table: type[Base], **equal: Any) -> int:
        with Session(self.engine) as session:
            return len(session.scalars(select(table.__mapper__.primary_key[0]).filter_by(**equal)).all())


def _put_outcome(session: Session, alert_id: int, outcome: str, detail: str, decision_id: int | None) -> None:
    row = session.get(AlertOutcome, alert_id)
    if row is None:
        session.add(AlertOutcome(alert_id=alert_id, outcome=outcome, detail=detail[:1000], decision_id=decision_id))
    else:
        row.outcome, row.detail, row.decision_id = outcome, detail[:1000], decision_id


def _as_dict(row: Base) -> dict:
    values = {column.key: getattr(row, column.key) for column in row.__table__.columns}
    return {key: value.isoformat() if isinstance(value, dt.datetime) else value for key, value in values.items()}


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
