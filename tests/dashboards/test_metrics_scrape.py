"""A live scrape of `governor serve` (real uvicorn, shipped model) is valid Prometheus exposition."""
import re
import subprocess
import time

import httpx

from tests.dashboards.servers import binary


def _complete(url: str, prompt: str, max_tokens: int = 16) -> dict:
    reply = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "governor-moe", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    reply.raise_for_status()
    return reply.json()


def test_live_scrape_passes_promtool_check_metrics(governor):
    url, _ = governor
    _complete(url, "def fib(n):\n")
    scrape = httpx.get(f"{url}/metrics", timeout=30)
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
    result = subprocess.run([binary("promtool"), "check", "metrics"], input=scrape.content, capture_output=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode() + result.stderr.decode() == "", "promtool lint findings"


def test_live_scrape_counts_a_request(governor):
    url, _ = governor

    def sample(text: str, name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    before = httpx.get(f"{url}/metrics", timeout=30).text
    reply = _complete(url, "import os\n", max_tokens=12)
    after = httpx.get(f"{url}/metrics", timeout=30).text
    assert reply["usage"]["completion_tokens"] == 12
    assert sample(after, "governor_generation_tokens_total") - sample(before, "governor_generation_tokens_total") == 12
    assert sample(after, "governor_requests_finished_total") - sample(before, "governor_requests_finished_total") == 1
    assert sample(after, "governor_e2e_request_latency_seconds_count") - sample(
        before, "governor_e2e_request_latency_seconds_count") == 1


def test_live_scrape_carries_the_config_the_engine_runs(governor):
    """The controller may have just applied a config; the engine adopts it at its next step."""
    url, _ = governor
    deadline = time.monotonic() + 60
    while True:
        _complete(url, "import os\n", max_tokens=2)
        config = httpx.get(f"{url}/admin/config", timeout=30).json()
        labels = _config_labels(httpx.get(f"{url}/metrics", timeout=30).text)
        if labels["version"] == str(config["version"]) or time.monotonic() > deadline:
            break
    assert labels["model"] == "governor-moe"
    assert labels["version"] == str(config["version"])
    assert labels["spec_method"] == config["spec_method"]
    assert labels["draft_len"] == str(config["draft_len"])


def _config_labels(scrape: str) -> dict[str, str]:
    info = re.search(r"^governor_config_info{(.*)} 1\.0$", scrape, re.M)
    assert info, "governor_config_info missing"
    return dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
