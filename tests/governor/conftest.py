"""A benchmark test module names its command (BENCH: the words after `governor bench`, --out aside) and the
result it writes (RESULT: NAME.json beside NAME.png); `out` runs it once per module, `data` reads its JSON."""
import json

import pytest

from governor.cli import main


@pytest.fixture(scope="module")
def out(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    assert main(["bench", *request.module.BENCH, "--out", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def data(request, out) -> dict:
    return json.loads((out / f"{request.module.RESULT}.json").read_text())
