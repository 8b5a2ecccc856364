"""Each Triton kernel against its reference on the CPU, in Triton's interpreter.

The checks run in a child pytest with TRITON_INTERPRET=1 in its environment from the start, because Triton
reads the flag when it is imported and when each @triton.jit runs: set inside this process it would depend on
whether anything had imported triton before, and it would leave every later Triton kernel interpreted.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = sorted((Path(__file__).parent / "interpreted").glob("check_*.py"))


@pytest.mark.parametrize("check", CHECKS, ids=[c.stem for c in CHECKS])
def test_triton_kernel_matches_its_reference_in_the_interpreter(check):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(check)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
