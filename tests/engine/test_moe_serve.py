"""`governor serve --ep 2`: two ranks serve, the window measures communication, workers stop with the server."""
import os
import signal
import subprocess
import sys

import httpx

from tests.governor.test_serve import _free_port, _wait_for


def test_serve_with_two_ranks_measures_the_communication_share():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "governor.cli", "serve", "--port", str(port), "--ep", "2",
                               "--no-controller"],
                              env={**os.environ, "GOVERNOR_ADMIN_TOKEN": "t"}, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=120)
        reply = httpx.post(f"{url}/v1/completions", json={"model": "governor-moe", "prompt": "def f(x):\n",
                                                          "max_tokens": 8, "temperature": 0, "ignore_eos": True},
                           timeout=60)
        assert reply.json()["usage"]["completion_tokens"] == 8
        window = httpx.get(f"{url}/admin/window?reader=controller").json()  # the seam a remote controller reads
        assert window["all_to_all_seconds"] > 0 and 0 < window["comm_share"] < 1
        assert [len(row) for row in window["rank_tokens"]] == [2] * 4
        children = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True,
                                                       text=True).stdout.split()]
        assert children
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0
    assert _wait_for(lambda: not any(_alive(pid) for pid in children), timeout=15)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_refuses_expert_parallelism_on_a_dense_model():
    result = subprocess.run([sys.executable, "-m", "governor.cli", "serve", "--model", "engine/assets/governor-draft",
                             "--ep", "2"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--ep" in result.stderr and "dense" in result.stderr
