"""The store on a real SQLite file: versions with diffs, the last known good across reopenings, alert dedupe."""
from controller.store import AlertOutcome, AlertRecord, ConfigVersion, Decision, Pin, Store
from seam import EngineConfig


def test_config_versions_record_their_diff_and_number(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    first = store.record_config(EngineConfig(draft_len=4), "engine", "start")
    second = store.record_config(EngineConfig(draft_len=6), "controller", "k 4 -> 6")
    assert (first.version, second.version) == (1, 2)
    newest = store.rows(ConfigVersion, 1)[0]
    assert newest["diff"] == {"draft_len": [4, 6]}
    assert store.config(2) == second


def test_last_known_good_and_pin_survive_reopening(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.db'}"
    store = Store(url)
    good = store.record_config(EngineConfig(draft_len=3), "controller", "kept")
    store.set_last_known_good(good)
    store.set_pin(Pin(good.version, "operator", "hold"))
    store.record_decision("keep", "measured 1.2x", {"k": 3}, predicted_gain=1.3, measured_gain=1.2)
    store.close()
    reopened = Store(url)
    assert reopened.last_known_good() == good
    assert reopened.pin() == Pin(good.version, "operator", "hold")
    decision = reopened.rows(Decision, 1)[0]
    assert (decision["action"], decision["predicted_gain"], decision["measured_gain"]) == ("keep", 1.3, 1.2)


def test_an_alert_notification_is_recorded_once_and_its_outcome_with_its_decision(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    alert = dict(fingerprint="abc", starts_at="2026-01-01T00:00:00Z", name="HighLatency", action="rollback",
                 labels={"alertname": "HighLatency"}, annotations={}, source="alertmanager")
    firing, outcome = store.record_alert(status="firing", **alert)
    assert outcome is None
    assert store.record_alert(status="firing", **alert) == (firing, None)      # recorded, never acted on
    decision = store.record_decision("notify", "acted", settles_alert=firing)
    assert store.record_alert(status="firing", **alert) == (firing, "acted")
    assert store.rows(AlertOutcome)[0]["decision_id"] == decision
    resolved, _ = store.record_alert(status="resolved", **alert)
    assert resolved != firing and store.count(AlertRecord) == 2
