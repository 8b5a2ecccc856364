"""`governor serve` runs the controller in-process by default: its decisions, admin API and alert intake are served
beside the OpenAI API, and a bad --policy is a clear error with exit 2."""
import os
import signal
import subprocess
import sys
import time

import httpx
import yaml

from engine.server.local_server import free_port
from tests.controller.conftest import fast_policy
from tests.controller.server import AUTH, ROOT, TOKEN
from tests.controller.traffic import HttpTraffic

ENV = {**os.environ, "GOVERNOR_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _serve(*flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "governor.cli", "serve", *flags], env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serve_runs_the_controller_and_its_admin_api(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(fast_policy()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve("--port", str(port), "--policy", str(policy), "--db", f"sqlite:///{tmp_path / 'g.db'}")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        with HttpTraffic(url):
            deadline = time.monotonic() + 60
            while httpx.get(f"{url}/admin/window").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.2)
        window = httpx.get(f"{url}/admin/window").json()
        assert window["emitted_tokens"] > 0                  # the controller's own window, closed in-process
        actions = [d["action"] for d in httpx.get(f"{url}/admin/decisions").json()["decisions"]]
        assert actions[-1] == "start"
        assert httpx.post(f"{url}/admin/rollback").status_code == 401
        assert httpx.post(f"{url}/admin/rollback", headers=AUTH).status_code == 200
        assert httpx.get(f"{url}/admin/controller").json()["policy"] == str(policy)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def test_serve_refuses_a_bad_policy_with_exit_2(tmp_path):
    policy = tmp_path / "bad.yaml"
    policy.write_text("slo:\n  ttft_p99_seconds: -1\n")
    server = _serve("--port", str(free_port()), "--policy", str(policy), "--db", f"sqlite:///{tmp_path / 'g.db'}")
    assert server.wait(timeout=120) == 2
    assert f"--policy: {policy}: slo.ttft_p99_seconds" in server.stderr.read()
