"""kill -9 of an expert-parallel worker under `governor serve --ep 2`: /health says so, the client gets a 5xx, the
group is respawned, and completions after that equal the single process's."""
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from governor.loaders import load_models
from seam import EngineConfig, SamplingParams
from tests.e2e.serving import start_serve, write_policy
from tests.engine.helpers import generate, metric_value

PROMPT = "def parse(line):\n"
MAX_TOKENS = 12


def _worker_pid(server_pid: int) -> int:
    """The spawned rank: a child of the server (of any of its threads) started by multiprocessing's spawn, not its
    resource tracker."""
    children = [pid for task in Path(f"/proc/{server_pid}/task").iterdir() for pid in _children(task)]
    for child in children:
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
        if "spawn_main" in cmdline:
            return int(child)
    raise AssertionError(f"no expert-parallel worker among the children of {server_pid}")


def _children(task: Path) -> list[str]:
    """A thread's child pids; none if the thread ended while we looked."""
    try:
        return (task / "children").read_text().split()
    except FileNotFoundError:
        return []


def _single_process_text() -> str:
    models = load_models("governor-moe", draft="none", device=torch.device("cpu"), dtype=torch.float32)
    engine = Engine(models.target, models.tokenizer, None, EngineConfig(spec_method="off"), EngineLimits())
    tokens = generate(engine, [models.tokenizer.encode(PROMPT)],
                      SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))[0]
    return models.tokenizer.decode(tokens)


def _complete(url: str, max_tokens: int = MAX_TOKENS) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "governor-moe", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})


def _stream(url: str, max_tokens: int) -> list[str]:
    """The server-sent events of a streamed completion, as their data strings."""
    with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json={
            "model": "governor-moe", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}) as reply:
        return [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]


def _until(predicate, timeout: float) -> float:
    """Seconds until predicate() held; fails after timeout."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - started


def test_a_killed_worker_rank_is_reported_failed_loudly_and_respawned(tmp_path):
    expected = _single_process_text()
    url, server = start_serve(tmp_path, "governor-ep", "--ep", "2", "--db", f"sqlite:///{tmp_path / 'g.db'}",
                              "--policy", str(write_policy(tmp_path)))
    try:
        assert _complete(url).json()["choices"][0]["text"] == expected
        worker = _worker_pid(server.process.pid)
        with ThreadPoolExecutor(2) as pool:
            in_flight, streaming = pool.submit(_complete, url, 400), pool.submit(_stream, url, 400)
            time.sleep(0.5)
            os.kill(worker, signal.SIGKILL)
            _until(lambda: httpx.get(f"{url}/health").status_code == 503, timeout=5)
            failed, events = in_flight.result(timeout=60), streaming.result(timeout=60)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "expert_parallel_rank_failed"
        assert json.loads(events[-1])["error"]["code"] == "expert_parallel_rank_failed"    # then the stream ends
        assert "[DONE]" not in events
        health = httpx.get(f"{url}/health")
        refused = _complete(url)
        if health.status_code == 503:       # still respawning: new requests are refused, to be retried
            assert "expert_parallel" in health.json()["reasons"]
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) > 0

        _until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=60)
        assert _worker_pid(server.process.pid) != worker
        assert _complete(url).json()["choices"][0]["text"] == expected
        metrics = httpx.get(f"{url}/metrics").text
        assert metric_value(metrics, "governor_request_errors_total", cause="expert_parallel_rank_failed") == 2.0
        assert metric_value(metrics, "governor_up", component="expert_parallel") == 1.0
    finally:
        server.stop()


def test_respawns_that_keep_failing_make_serve_exit_non_zero_for_its_supervisor(tmp_path):
    url, server = start_serve(tmp_path, "governor-ep-doomed", "--ep", "2", "--no-controller",
                              injected={"GOVERNOR_TEST_FAIL_RESPAWNS": "1"})
    try:
        os.kill(_worker_pid(server.process.pid), signal.SIGKILL)
        assert server.process.wait(timeout=90) == 1
        assert "3 respawns of the expert-parallel group failed within 60 s" in server.log()
    finally:
        server.stop()


def test_a_sigterm_to_the_whole_process_group_stops_serving_without_a_failed_step(tmp_path):
    # What Ctrl-C or `timeout` does: every process of the group gets the signal at once. The worker leaves its
    # lifetime to rank 0, so the request in flight finishes and nothing is respawned on the way down.
    url, server = start_serve(tmp_path, "serve", "--ep", "2", "--no-controller", "--db",
                              f"sqlite:///{tmp_path}/governor.db")
    try:
        worker = _worker_pid(server.process.pid)
        with ThreadPoolExecutor(1) as pool:
            streamed = pool.submit(_stream, url, 96)
            _until(lambda: (metric_value(httpx.get(f"{url}/metrics").text, "governor_kv_blocks_in_use") or 0) > 0,
                   timeout=60)
            os.kill(worker, signal.SIGTERM)
            os.kill(server.process.pid, signal.SIGTERM)
            assert server.process.wait(timeout=60) == -signal.SIGTERM   # uvicorn re-raises it once shut down
            events = streamed.result(timeout=60)
        assert events[-1] == "[DONE]" and not any('"error"' in event for event in events)
        assert "engine step failed" not in server.log() and "respawn" not in server.log()
        _until(lambda: not Path(f"/proc/{worker}").exists(), timeout=30)
    finally:
        server.stop()
