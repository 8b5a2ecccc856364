"""A controller pair as real `governor control` processes on one engine and one PostgreSQL database: one leads by
the lease, the other stands by (its /admin/controller says so, its writes answer 409, alerts it receives are acted
on once, by the leader). kill -9 of the leader mid-trial: the standby leads within 2 windows, the open trial is
reverted to its incumbent and recorded as interrupted once, and no decision is recorded twice."""
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
import yaml

from controller.store import AlertOutcome, Store, Trial
from engine.server.local_server import free_port
from engine.server.service import EngineService
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.controller.server import AUTH, ROOT, TOKEN, serving
from tests.controller.test_alerts import _payload
from tests.controller.traffic import HttpTraffic
from tests.engine.helpers import make_engine

WINDOW = 1.5


@pytest.fixture
def engine_server(moe_models):
    service = EngineService(make_engine(moe_models, EngineConfig(draft_len=1)))
    with serving(service, None) as url, HttpTraffic(url):
        yield url


def _control(engine: str, policy, db: str, holder: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "GOVERNOR_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "governor.cli", "control", "--engine", engine, "--policy",
                             str(policy), "--db", db, "--holder", holder, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _leadership(port: int) -> dict | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/admin/controller", timeout=5).json()["leadership"]
    except httpx.HTTPError:
        return None


def _all_see_a_leader(ports) -> list[dict] | None:
    states = [_leadership(port) for port in ports]
    return states if all(state and state["leader"] for state in states) else None


def _open_trial(store: Store) -> dict | None:
    """A running trial whose `trial` decision is recorded (the two are separate writes)."""
    running = {t["id"]: t for t in store.rows(Trial) if t["outcome"] == "running"}
    recorded = [d["trial_id"] for d in store.decisions(action="trial") if d["trial_id"] in running]
    return running[recorded[0]] if recorded else None


def _no_longer_serves(engine: str, version: int, looks: int = 20) -> bool:
    """Has the engine, over looks polls 50 ms apart, never served config version? An experiment left running after
    the kill would alternate back to its candidate within a few steps; the new leader, once it reverted, may already
    try configs of its own (on a fast machine it kept one within 10 s of the resume)."""
    for _ in range(looks):
        if httpx.get(f"{engine}/admin/config").json()["version"] == version:
            return False
        time.sleep(0.05)
    return True


def _wait(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def test_kill_9_of_the_leader_mid_trial_hands_over_to_the_standby(engine_server, postgres_server, tmp_path):
    db, ports = postgres_server.new_database(), {"a": free_port(), "b": free_port()}
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(fast_policy(window={"seconds": WINDOW}, speculation={"reprobe_windows": 1})))
    processes = {name: _control(engine_server, policy, db, name, port) for name, port in ports.items()}
    try:
        states = _wait(lambda: _all_see_a_leader(ports.values()), "both controllers to answer and see a leader")
        leader = states[0]["leader"]
        standby = "b" if leader == "a" else "a"
        store = Store(db)
        _wait(lambda: store.decisions(action="start"), "the leader's first start")
        assert _leadership(ports[standby])["role"] == "standby"
        refused = httpx.post(f"http://127.0.0.1:{ports[standby]}/admin/rollback", headers=AUTH)
        assert refused.status_code == 409 and leader in refused.json()["error"]["message"]

        # an alert delivered to the standby is left to the leader, which acts on it once; redelivered, it is a no-op
        alert = _payload(action="notify", fingerprint="f00d")
        deferred = httpx.post(f"http://127.0.0.1:{ports[standby]}/alerts", json=alert, headers=AUTH).json()
        assert [d["outcome"] for d in deferred["deferred"]] == ["deferred"]
        _wait(lambda: [r for r in store.rows(AlertOutcome) if r["outcome"] == "acted"], "the leader to act")
        again = httpx.post(f"http://127.0.0.1:{ports[leader]}/alerts", json=alert, headers=AUTH).json()
        assert again["duplicates"] == 1 and len(store.decisions(action="notify")) == 1

        trial = _wait(lambda: _open_trial(store), "a trial and its decision")
        processes[leader].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        processes[leader].wait(timeout=10)
        _wait(lambda: (_leadership(ports[standby]) or {}).get("role") == "leader", "the standby to lead", 10)
        took = time.monotonic() - killed
        assert took <= 2 * WINDOW, f"the standby led {took:.2f} s after the kill"

        _wait(lambda: store.decisions(action="resume"), "the new leader's resume")
        finished = next(t for t in store.rows(Trial) if t["id"] == trial["id"])
        assert finished["outcome"] == "interrupted"
        assert store.decisions(action="resume")[0]["config_version"] == trial["baseline_version"]
        _wait(lambda: _no_longer_serves(engine_server, trial["config_version"]), "the revert", 10)
        decisions = store.decisions(limit=1000)
        assert [d["action"] for d in decisions if d["trial_id"] == trial["id"]] == ["trial"]
        assert len(store.decisions(action="resume")) == 1 and len(store.decisions(action="start")) == 1
        per_trial = Counter((d["action"], d["trial_id"]) for d in decisions if d["trial_id"] is not None)
        assert max(per_trial.values()) == 1, per_trial
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
    assert processes[standby].wait(timeout=30) == 0, processes[standby].stderr.read()
