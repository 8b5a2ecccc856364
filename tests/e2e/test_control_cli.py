"""`governor control` as a real subprocess against a real engine server: kill -9 while a trial is open loses no
recorded decision, and a restart marks the trial interrupted and resumes the last known good config."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from controller.store import Decision, Store, Trial
from engine.server.service import EngineService
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.controller.server import ROOT, TOKEN, serving
from tests.controller.traffic import HttpTraffic
from tests.engine.helpers import make_engine

DECISION = re.compile(r"^decision (\d+) (\w+): ")


def _control(url: str, policy: Path, db: str) -> subprocess.Popen:
    env = {**os.environ, "GOVERNOR_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "governor.cli", "control", "--engine", url, "--policy", str(policy),
                             "--db", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _read_decisions(process: subprocess.Popen, until, timeout: float = 90.0) -> list[tuple[int, str]]:
    """(id, action) of each decision the process reported, until until(decisions) holds."""
    decisions, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline and not until(decisions):
        line = process.stdout.readline()
        if not line:
            break
        match = DECISION.match(line)
        if match:
            decisions.append((int(match[1]), match[2]))
    assert until(decisions), (decisions, process.poll(), process.stderr.read() if process.poll() is not None else "")
    return decisions


@pytest.fixture
def engine_server(moe_models):
    service = EngineService(make_engine(moe_models, EngineConfig(draft_len=1)))
    with serving(service, None) as url, HttpTraffic(url):
        yield url


def test_kill_9_mid_trial_loses_no_decision_and_restart_resumes_the_last_known_good(engine_server, tmp_path):
    url, db = engine_server, f"sqlite:///{tmp_path / 'governor.db'}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(fast_policy(window={"seconds": 2.0}, speculation={"reprobe_windows": 3})))
    first = _control(url, policy, db)
    reported = _read_decisions(first, lambda ds: len(ds) > 1 and ds[-1][1] == "trial")
    first.send_signal(signal.SIGKILL)      # a trial is open: its verdict comes a whole window later
    first.wait(timeout=10)

    store = Store(db)
    recorded = {row["id"]: row for row in store.rows(Decision, 10_000)}
    assert all(recorded[i]["action"] == action for i, action in reported), (reported, recorded)
    trial = _trial(store, recorded[reported[-1][0]]["trial_id"])
    assert trial["outcome"] == "running"
    good, on_trial = store.last_known_good(), store.config(trial["config_version"])
    assert on_trial != good
    _assert_serves(url, on_trial)       # the engine keeps the trial's config while no controller runs

    second = _control(url, policy, db)
    try:
        resumed = _read_decisions(second, lambda ds: any(a == "resume" for _, a in ds))
        assert resumed[0][1] == "resume"
        assert _trial(Store(db), trial["id"])["outcome"] == "interrupted"
        _assert_serves(url, good)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0


def _assert_serves(url: str, config: EngineConfig) -> None:
    deadline = time.monotonic() + 10     # the engine adopts a config at its next step
    while (served := EngineConfig.model_validate(httpx.get(f"{url}/admin/config").json())) != config and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert served == config, (served, config)


def _trial(store: Store, trial_id: int) -> dict:
    return next(t for t in store.rows(Trial, 10_000) if t["id"] == trial_id)


@pytest.mark.parametrize("flags, message", [
    (["--db", "nosuch://x"], "governor control: --db: nosuch://x: "),
    (["--policy", "no-such-policy.yaml"], "governor control: --policy: no-such-policy.yaml: (file): "),
])
def test_control_refuses_bad_flags_with_exit_2(flags, message, tmp_path, capsys):
    from governor.cli import main
    base = ["control", "--engine", "http://127.0.0.1:1", "--db", f"sqlite:///{tmp_path / 'g.db'}"]
    assert main(base + flags) == 2
    assert message in capsys.readouterr().err
