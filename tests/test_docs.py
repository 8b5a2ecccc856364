"""The docs: the site builds in strict mode (a broken link, anchor, image or snippet fails it, and the HTTP API page is
rendered from the apps' OpenAPI documents), the README stays short and its links resolve, and results/ holds only
runs the docs cite, indexed, under 2 MB."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
DOCS = ROOT / "docs"
README_MAX_LINES = 300
RESULTS_MAX_BYTES = 2_000_000
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _result_folders() -> list[str]:
    """Every folder under results/, as the path the docs cite: 'results/<...>/'."""
    return sorted(f"{Path(d).relative_to(ROOT).as_posix()}/" for d, _, _ in os.walk(RESULTS) if Path(d) != RESULTS)


def _pages() -> dict[str, str]:
    """README.md and every docs page, not the results/ pages that docs/results links in."""
    pages = {"README.md": (ROOT / "README.md").read_text()}
    for folder, _, files in os.walk(DOCS):      # os.walk does not follow the docs/results symlink
        for name in files:
            if name.endswith(".md"):
                path = Path(folder) / name
                pages[path.relative_to(ROOT).as_posix()] = path.read_text()
    return pages


def test_the_site_builds_in_strict_mode(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "/v1/chat/completions" in api and "EngineConfig" in api     # the generated reference is there
    assert (tmp_path / "site" / "openapi.json").is_file()


def test_the_readme_is_at_most_300_lines():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_readme_links_resolve():
    """mkdocs checks the pages' links; the README is not one of them, so its relative links are checked here."""
    readme = (ROOT / "README.md").read_text()
    targets = [t for t in LINK.findall(readme) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert targets
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_results_stay_under_2_mb():
    size = sum((Path(d) / name).stat().st_size for d, _, files in os.walk(RESULTS) for name in files)
    assert size < RESULTS_MAX_BYTES, f"results/ holds {size:,} bytes; prune runs no page cites (git keeps them)"


def test_every_results_folder_is_indexed():
    index = (RESULTS / "README.md").read_text()
    unlisted = [folder for folder in _result_folders() if folder not in index]
    assert not unlisted, f"results/README.md does not list {unlisted}"


def test_every_results_folder_is_cited_by_a_docs_page_or_the_readme():
    pages = _pages()
    uncited = [folder for folder in _result_folders() if not any(folder in text for text in pages.values())]
    assert not uncited, f"no docs page nor the README cites {uncited}: cite it by its full path, or delete it"
