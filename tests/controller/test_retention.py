"""Retention on a real store (SQLite; the whole sweep on PostgreSQL too) under a real controller: old decisions, trials and windows go; the config
history that last-known-good, a pin and rollback need stays, and rollback still works after a sweep."""
import datetime as dt

from controller.operate.actions import Operator
from controller.operate.retention import RetentionSweeper
from controller.store import SETTLED, ConfigVersion, Decision, Pin, Rollback, Trial
from seam import EngineConfig
from tests.controller.conftest import fast_policy


def _history(controller):
    """Versions: start (v1, the last known good), then trials of k = 2 and 3 (reverted), then a pin of k = 5."""
    store = controller.store
    for k in (2, 3):
        config = store.record_config(EngineConfig(draft_len=k), "controller", f"try k={k}")
        trial = store.start_trial("rules", config, controller.last_known_good, 1.1)
        store.finish_trial(trial, "reverted", 0.9)
        Operator(controller).notify(f"window judged k={k}", {"emitted_tokens": 100})
    Operator(controller).rollback("operator rollback")
    Operator(controller).pin(EngineConfig(draft_len=5), "operator", "hold k=5")


def test_a_sweep_past_everything_keeps_what_rollback_needs(build, store_url):
    engine, controller = build(fast_policy(), k=1, url=store_url)
    _history(controller)
    lkg, pinned = controller.last_known_good.version, controller.current.version
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)
    deleted = RetentionSweeper(controller, days=1).sweep(now=later)
    store = controller.store
    assert deleted["decisions"] > 0 and deleted["trials"] == 2 and deleted["rollbacks"] == 1
    assert store.count(Decision) == store.count(Trial) == store.count(Rollback) == 0
    assert {row["id"] for row in store.rows(ConfigVersion)} == {lkg, pinned}
    assert store.last_known_good().version == lkg and store.pin() == Pin(pinned, "operator", "hold k=5")
    Operator(controller).rollback("operator rollback after the sweep", lift_pin=True)     # as POST /admin/rollback does
    assert engine.snapshot().config_version == lkg and controller.current == store.config(lkg)


def test_a_sweep_keeps_records_younger_than_the_retention(build):
    _, controller = build(fast_policy(), k=1)
    _history(controller)
    store = controller.store
    counts = {table: store.count(table) for table in (Decision, Trial, Rollback, ConfigVersion)}
    assert not any(RetentionSweeper(controller, days=1).sweep().values())
    assert {table: store.count(table) for table in counts} == counts


def test_zero_days_keeps_everything(build):
    _, controller = build(fast_policy(), k=1)
    _history(controller)
    decisions = controller.store.count(Decision)
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=365)
    assert RetentionSweeper(controller, days=0).sweep(now=later) == {}
    assert controller.store.count(Decision) == decisions


def test_a_sweep_keeps_alert_outcomes_so_a_redelivery_still_acts_once(build):
    _, controller = build(fast_policy(), k=1)
    store = controller.store
    alert = {"fingerprint": "f1", "starts_at": "2026-01-01T00:00:00Z", "status": "firing", "name": "SLO",
             "action": "notify", "labels": {"alertname": "SLO"}, "annotations": {}, "source": "alertmanager"}
    alert_id, _ = store.record_alert(**alert)
    decision = Operator(controller).notify("alert SLO firing: notify", {}, alert=alert_id)
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)
    assert RetentionSweeper(controller, days=1).sweep(now=later)["decisions"] > 0
    assert store.count(Decision, id=decision) == 0
    assert store.record_alert(**alert) == (alert_id, "acted") and "acted" in SETTLED
    assert store.alerts()[0]["outcome"] == "acted" and store.alerts()[0]["decision_id"] is None
