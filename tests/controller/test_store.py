"""The store on both backends (a real SQLite file and a real PostgreSQL server): versions with diffs, the last known
good across reopenings, alert dedupe, and two writers on separate connections at once."""
import threading

from controller.store import AlertOutcome, AlertRecord, ConfigVersion, Decision, Pin, Store, Trial, config_diff
from seam import EngineConfig


def test_config_versions_record_their_diff_and_number(store_url):
    store = Store(store_url)
    first = store.record_config(EngineConfig(draft_len=4), "engine", "start")
    second = store.record_config(EngineConfig(draft_len=6), "controller", "k 4 -> 6")
    assert (first.version, second.version) == (1, 2)
    newest = store.rows(ConfigVersion, 1)[0]
    assert newest["diff"] == {"draft_len": [4, 6]}
    assert store.config(2) == second


def test_last_known_good_and_pin_survive_reopening(store_url):
    url = store_url
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


def test_an_alert_notification_is_recorded_once_and_its_outcome_with_its_decision(store_url):
    store = Store(store_url)
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


def _at_once(*work) -> None:
    """Run each callable in its own thread, all released together; re-raise the first failure."""
    start, failures = threading.Barrier(len(work)), []

    def run(job):
        start.wait()
        try:
            job()
        except BaseException as error:    # noqa: BLE001 - reported below
            failures.append(error)
    threads = [threading.Thread(target=run, args=(job,)) for job in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


def test_two_writers_at_once_keep_versions_trials_and_alerts_whole(store_url):
    """Two Store objects (two engines, two connection pools, as two controller processes have) write at once."""
    first, second = Store(store_url), Store(store_url)
    base = first.record_config(EngineConfig(draft_len=1), "engine", "start")
    trials = [first.start_trial("rule", base, base, None) for _ in range(8)]
    alert = dict(starts_at="2026-01-01T00:00:00Z", status="firing", name="HighLatency", action="notify",
                 labels={"alertname": "HighLatency"}, annotations={}, source="alertmanager")
    finished: dict[str, list[int]] = {"first": [], "second": []}
    alert_ids: dict[str, list[int]] = {"first": [], "second": []}

    def writer(store: Store, name: str, k: int):
        def work():
            for i in range(6):
                store.record_config(EngineConfig(draft_len=k + i), name, f"{name} {i}")
                alert_ids[name].append(store.record_alert(fingerprint=f"fp{i}", **alert)[0])
            finished[name].extend(t for t in trials if store.finish_trial(t, f"by-{name}", None))
        return work
    _at_once(writer(first, "first", 2), writer(second, "second", 10))

    versions = sorted(first.config_versions(1000), key=lambda v: v["id"])
    assert len(versions) == 13
    for before, after in zip(versions, versions[1:]):     # each diff is against the version just before it
        assert after["diff"] == config_diff(before["config"], after["config"])
        assert after["config"]["version"] == after["id"]
    assert sorted(finished["first"] + finished["second"]) == trials        # each trial finished exactly once
    outcomes = {row["id"]: row["outcome"] for row in first.rows(Trial, 100)}
    assert all(outcomes[t] == ("by-first" if t in finished["first"] else "by-second") for t in trials)
    assert first.count(AlertRecord) == 6 and alert_ids["first"] == alert_ids["second"]     # one row per alert


def test_a_non_finite_statistic_is_stored_and_read_as_null(store_url):
    store = Store(store_url)
    store.record_decision("trial", "degenerate", inputs={"interval": [0.0, float("inf")], "p": float("nan"),
                                                         "nested": [{"x": float("-inf")}]})
    assert store.decisions(1)[0]["inputs"] == {"interval": [0.0, None], "p": None, "nested": [{"x": None}]}


def test_an_older_sqlite_row_holding_infinity_is_read_as_null(tmp_path):
    """Earlier versions wrote Python's json (Infinity, NaN) into SQLite's JSON text; such rows read back as null."""
    store = Store(f"sqlite:///{tmp_path / 'governor.db'}")
    store.record_decision("trial", "older", inputs={"interval": [0.0, 1.0]})
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE governor_decisions SET inputs = '{\"interval\": [0.0, Infinity], \"p\": NaN}'")
    assert store.decisions(1)[0]["inputs"] == {"interval": [0.0, None], "p": None}
