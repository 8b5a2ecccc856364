import os
import sys

import pytest

from tests.dashboards.servers import Server, free_port

ADMIN_TOKEN = "governor-test-admin-token"


@pytest.fixture(scope="session")
def governor(tmp_path_factory):
    """`governor serve` with the shipped model on a free loopback port: (base URL, Server)."""
    port = free_port()
    folder = tmp_path_factory.mktemp("governor")
    server = Server("governor", [sys.executable, "-m", "governor.cli", "serve", "--port", str(port),
                                 "--db", f"sqlite:///{folder / 'governor.db'}"],
                    folder, env={**os.environ, "GOVERNOR_ADMIN_TOKEN": ADMIN_TOKEN})
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(f"{url}/health", timeout=180)
        yield url, server
    finally:
        server.stop()
