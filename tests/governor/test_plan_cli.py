"""`governor plan` run as a real subprocess: JSON out on good input, one line and exit 2 on bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seam.placement import Topology, check_placement, placement_balancedness

ROOT = Path(__file__).resolve().parents[2]
HEAT = {"heat": [[120, 5, 7, 300, 9, 11, 40, 2], [0, 0, 0, 50, 0, 0, 0, 1]]}


def governor_plan(*flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "governor.cli", "plan", *flags], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def test_prints_a_valid_placement_and_its_balancedness(tmp_path):
    heat_file = write(tmp_path, "heat.json", json.dumps(HEAT))
    result = governor_plan("--heat", heat_file, "--nodes", "2", "--devices", "4", "--slots-per-device", "3")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    topology = Topology(nodes=2, devices=4, slots_per_device=3)
    check_placement(out["phy2log"], topology, num_layers=2, num_experts=8)
    assert out["balancedness"] == pytest.approx(placement_balancedness(np.array(HEAT["heat"]), out["phy2log"],
                                                                       topology))
    assert out["phy2log"][0].count(3) > 1          # the hottest expert of layer 0 gets a spare slot


BAD_FILES = {
    "missing.json": (None, "cannot read"),
    "broken.json": ('{"heat": [[1, 2]', "is not JSON"),
    "list.json": ("[[1, 2]]", "must hold a JSON object"),
    "nokey.json": ('{"tokens": [[1, 2]]}', "heat: Field required"),
    "ragged.json": ('{"heat": [[1, 2], [3]]}', "layer 1 has 1 experts, layer 0 has 2"),
    "negative.json": ('{"heat": [[1, -2]]}', "heat, layer 0, expert 1: Input should be greater than or equal to 0"),
    "nan.json": ('{"heat": [[1, NaN]]}', "heat, layer 0, expert 1: Input should be a finite number"),
    "empty.json": ('{"heat": []}', "no layers"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_heat_file_is_one_line_naming_the_problem(tmp_path, name):
    text, problem = BAD_FILES[name]
    path = str(tmp_path / name) if text is None else write(tmp_path, name, text)
    result = governor_plan("--heat", path, "--nodes", "1", "--devices", "2", "--slots-per-device", "2")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and problem in result.stderr and "--heat" in result.stderr


@pytest.mark.parametrize("flags,problem", [
    (("--nodes", "1", "--devices", "2", "--slots-per-device", "3"), "6 slots (2 devices x 3) cannot hold 8 experts"),
    (("--nodes", "3", "--devices", "4", "--slots-per-device", "2"), "devices (4) must be a multiple of nodes (3)"),
    (("--nodes", "0", "--devices", "4", "--slots-per-device", "2"), "--nodes: Input should be greater than 0"),
    (("--nodes", "1", "--devices", "4", "--slots-per-device", "two"), "--slots-per-device: Input should be a valid"),
])
def test_bad_topology_is_one_line_naming_the_problem(tmp_path, flags, problem):
    result = governor_plan("--heat", write(tmp_path, "heat.json", json.dumps(HEAT)), *flags)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and problem in result.stderr
