"""The one-way layers hold (import-linter, contracts in pyproject.toml), and lint-imports catches a breach."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = [folder.name for folder in ROOT.iterdir() if (folder / "__init__.py").is_file() and folder.name != "tests"]


def lint_imports(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=folder, capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_engine_module_that_imports_the_controller_breaks_the_contracts(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "engine" / "reaches_up.py").write_text("from controller.loop import Controller\n")

    result = lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "engine.reaches_up -> controller.loop" in result.stdout
    assert "The engine knows nothing of the controller, the dashboards or the policies BROKEN" in result.stdout
