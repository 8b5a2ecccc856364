import os

import pytest
import torch

from governor.loaders import load_models
from tests.postgres import PostgresServer, postgres_bindir

# `make test-fast` leaves these out (`-m "not slow"`); `make test` and CI run everything. Slow: they spawn servers,
# ranks or Debian's daemons, train, run a whole benchmark, or drive live traffic for tens of seconds.
SLOW = (
    "tests/e2e/",                                   # `governor serve` / `governor control` processes
    "tests/governor/test_bench_",                   # whole benchmarks
    "tests/governor/test_serve.py", "tests/governor/test_plan_cli.py", "tests/engine/test_moe_serve.py",
    "tests/engine/test_moe_ep.py", "tests/engine/test_moe_ep_failure.py",    # expert-parallel ranks
    "tests/dashboards/test_alerting_e2e.py", "tests/dashboards/test_metrics_scrape.py",   # Prometheus, Alertmanager
    "tests/dashboards/test_web.py",                 # Chromium
    "tests/engine/test_training.py",                # trains
    "tests/governor_kernels/test_triton_interpreted.py",   # a Triton interpreter subprocess per kernel
    "tests/engine/test_sampling.py", "tests/engine/test_speculative.py", "tests/engine/test_gguf.py",
    "tests/controller/test_draft_len.py", "tests/controller/test_fallback.py",
    "tests/controller/test_optuna.py",              # live traffic
)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core: a torch thread pool each would oversubscribe the cores, and OpenMP's
    # spinning threads then slow every test of both workers several-fold
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def moe_models():
    """The shipped byte-level MoE target and its draft, on the CPU in fp32."""
    return load_models("governor-moe", device=torch.device("cpu"), dtype=torch.float32)


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL server per test process; skipped where PostgreSQL is not installed, except in CI
    (.ci/run installs it there, and a store that was never tried on it must not pass as green)."""
    bindir = postgres_bindir()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed: .ci/run installs the postgresql package")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    server = PostgresServer(bindir).start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """An empty store database on each backend: a SQLite file, and a fresh database on a real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'governor.db'}"
    return request.getfixturevalue("postgres_server").new_database()
