"""`governor serve --demo-traffic` (the README's run command) serves, and its own demo traffic flows; bad flags are
refused; open connections are capped."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def test_serve_with_demo_traffic_answers_and_measures_its_own_traffic(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "governor.cli", "serve", "--port", str(port), "--demo-traffic",
                               "--db", f"sqlite:///{tmp_path / 'governor.db'}"],
                              env={**os.environ, "GOVERNOR_ADMIN_TOKEN": "t"}, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=120), server.stderr
        # /admin/window is the controller's latest closed window (404 until the first one closes)
        assert _wait_for(lambda: httpx.get(f"{url}/admin/window").json().get("emitted_tokens", 0) > 0, timeout=90)
        assert httpx.get(f"{url}/openapi.json").json()["paths"]["/v1/completions"]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


def test_serve_refuses_a_bad_flag_naming_it():
    result = subprocess.run([sys.executable, "-m", "governor.cli", "serve", "--port", "70000"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--port" in result.stderr


def test_serve_refuses_an_unknown_model_naming_it():
    result = subprocess.run([sys.executable, "-m", "governor.cli", "serve", "--model", "/no/such/model"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "/no/such/model" in result.stderr


def test_connections_past_the_cap_get_503_and_the_server_recovers_once_they_close(tmp_path):
    port, cap = _free_port(), 8
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "governor.cli", "serve", "--port", str(port), "--no-controller"],
                              env={**os.environ, "GOVERNOR_MAX_CONNECTIONS": str(cap)}, stderr=subprocess.PIPE,
                              text=True)
    idle = []
    try:
        assert _wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=120), server.stderr
        assert 'governor_limit{limit="max_connections",model="governor-moe"} 8.0' in httpx.get(f"{url}/metrics").text
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(cap)]
        assert _wait_for(lambda: httpx.get(f"{url}/health").status_code == 503, timeout=10)
        for connection in idle:
            connection.close()
        assert _wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=10)
    finally:
        for connection in idle:
            connection.close()
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
