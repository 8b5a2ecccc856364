"""The controller's durable record (SQLAlchemy 2.x): config versions with diffs, trials, decisions, alerts,
rollbacks, and the last-known-good config. Every write commits at once, so a kill -9 loses nothing recorded."""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, UniqueConstraint, create_engine, \
    delete, event, func, or_, select
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from seam import EngineConfig


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


class StoreError(RuntimeError):
    """The database URL cannot be used; the message names the URL and why."""


class Store:
    def __init__(self, url: str):
        self.url = url
        try:
            self.engine = create_engine(url, json_serializer=lambda v: json.dumps(v, default=str))
            if url.startswith("sqlite"):
                event.listen(self.engine, "connect", _sqlite_pragmas)
            Base.metadata.create_all(self.engine)
        except (ArgumentError, NoSuchModuleError, OperationalError) as error:
            raise StoreError(f"{url}: {str(error).splitlines()[0]}") from None

    def close(self) -> None:
        self.engine.dispose()

    def _add(self, row: Base) -> int:
        with Session(self.engine) as session, session.begin():
            session.add(row)
            session.flush()
            return row.id

    # -- config versions and the last known good ---------------------------------------------------------------

    def record_config(self, config: EngineConfig, source: str, reason: str) -> EngineConfig:
        """Store config as a new version; returns it stamped with that version number."""
        with Session(self.engine) as session, session.begin():
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

    def _set_state(self, key: str, value: dict | None) -> None:
        with Session(self.engine) as session, session.begin():
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

    def record_decision(self, action: str, reason: str, inputs: dict[str, Any] | None = None,
                        predicted_gain: float | None = None, measured_gain: float | None = None,
                        config_version: int | None = None, trial_id: int | None = None) -> int:
        return self._add(Decision(action=action, reason=reason[:1000], inputs=inputs or {},
                                  predicted_gain=predicted_gain, measured_gain=measured_gain,
                                  config_version=config_version, trial_id=trial_id))

    def start_trial(self, policy: str, config: EngineConfig, baseline: EngineConfig, predicted_gain: float | None,
                    optuna_trial: int | None = None) -> int:
        return self._add(Trial(policy=policy, config_version=config.version, baseline_version=baseline.version,
                               predicted_gain=predicted_gain, optuna_trial=optuna_trial))

    def finish_trial(self, trial_id: int, outcome: str, measured_gain: float | None) -> None:
        with Session(self.engine) as session, session.begin():
            trial = session.get(Trial, trial_id)
            trial.outcome, trial.measured_gain, trial.ended_at = outcome, measured_gain, _now()

    def running_trials(self) -> list[int]:
        with Session(self.engine) as session:
            return list(session.scalars(select(Trial.id).where(Trial.outcome == "running")))

    def record_rollback(self, reason: str, from_version: int | None, to_version: int, decision_id: int) -> int:
        return self._add(Rollback(reason=reason[:1000], from_version=from_version, to_version=to_version,
                                  decision_id=decision_id))

    # -- alerts ------------------------------------------------------------------------------------------------

    def record_alert(self, *, fingerprint: str, starts_at: str, status: str, name: str, action: str, labels: dict,
                     annotations: dict, source: str) -> bool:
        """Record one alert notification; False if this (fingerprint, startsAt, status) was recorded before."""
        try:
            self._add(AlertRecord(fingerprint=fingerprint, starts_at=starts_at, status=status, name=name[:200],
                                  action=action, labels=labels, annotations=annotations, source=source))
        except IntegrityError:
            return False
        return True

    # -- retention ---------------------------------------------------------------------------------------------

    def prune(self, before: dt.datetime, keep_versions: set[int] = frozenset()) -> dict[str, int]:
        """Delete decisions, rollbacks and finished trials recorded before `before`, then config versions that are
        older and nothing left refers to. Never deleted: the last-known-good, the pinned and the newest version,
        keep_versions (e.g. the config in use), and alerts (their records make a redelivery act only once).
        Returns the rows deleted per table."""
        with Session(self.engine) as session, session.begin():
            old_decisions = select(Decision.id).where(Decision.at < before)
            rollbacks = session.execute(delete(Rollback).where(
                or_(Rollback.at < before, Rollback.decision_id.in_(old_decisions)))).rowcount
            decisions = session.execute(delete(Decision).where(Decision.at < before)).rowcount
            trials = session.execute(delete(Trial).where(
                Trial.started_at < before, Trial.outcome != "running",
                Trial.id.not_in(select(Decision.trial_id).where(Decision.trial_id.is_not(None))))).rowcount
            keep = set(keep_versions) | self._held_versions(session)
            newest = session.scalar(select(func.max(ConfigVersion.id)))
            referenced = [select(column).where(column.is_not(None)) for column in (
                Decision.config_version, Trial.config_version, Trial.baseline_version, Rollback.from_version,
                Rollback.to_version)]
            query = delete(ConfigVersion).where(ConfigVersion.at < before, ConfigVersion.id.not_in(keep | {newest}))
            for refs in referenced:
                query = query.where(ConfigVersion.id.not_in(refs))
            versions = session.execute(query).rowcount
        return {"decisions": decisions, "rollbacks": rollbacks, "trials": trials, "config_versions": versions}

    @staticmethod
    def _held_versions(session: Session) -> set[int]:
        """The versions the last-known-good and the pin name."""
        lkg, pin = session.get(StateEntry, "last_known_good"), session.get(StateEntry, "pin")
        return {version for version in (lkg and lkg.value["version"], pin and pin.value["config_version"]) if version}

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

    def alerts(self, limit: int = 100) -> list[dict]:
        return self.rows(AlertRecord, limit)

    def count(self, table: type[Base], **equal: Any) -> int:
        with Session(self.engine) as session:
            return len(session.scalars(select(table.__mapper__.primary_key[0]).filter_by(**equal)).all())


def _as_dict(row: Base) -> dict:
    values = {column.key: getattr(row, column.key) for column in row.__table__.columns}
    return {key: value.isoformat() if isinstance(value, dt.datetime) else value for key, value in values.items()}


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
