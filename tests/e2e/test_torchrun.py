"""`governor serve` launched by torchrun as if on two nodes: two agents on loopback, one process each. Rank 0 serves
HTTP with half of the experts, rank 1 holds the other half, and greedy completions equal the single process's; when
rank 1 dies, the request in flight gets a 5xx and rank 0 exits non-zero for torchrun to restart the group."""
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from governor.loaders import load_models
from seam import EngineConfig, SamplingParams
from tests.dashboards.servers import Server, free_port
from tests.e2e.serving import ENV
from tests.engine.helpers import generate

BIN = Path(sys.executable).parent
PROMPTS = ["def parse(line):\n", "class Stack:\n    def push(self"]
MAX_TOKENS = 10


def single_process_texts() -> list[str]:
    models = load_models("governor-moe", draft="none", device=torch.device("cpu"), dtype=torch.float32)
    engine = Engine(models.target, models.tokenizer, None, EngineConfig(spec_method="off"), EngineLimits())
    outputs = generate(engine, [models.tokenizer.encode(prompt) for prompt in PROMPTS],
                       SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    return [models.tokenizer.decode(tokens) for tokens in outputs]


def complete_reply(url: str, prompt: str, max_tokens: int = MAX_TOKENS) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "governor-moe", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})


def complete(url: str, prompt: str) -> str:
    reply = complete_reply(url, prompt)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def rank_process(agent: Server) -> int:
    """The one governor process an agent started."""
    children = [int(pid) for task in Path(f"/proc/{agent.process.pid}/task").iterdir()
                for pid in (task / "children").read_text().split()]
    ranks = [pid for pid in children if b"governor" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(ranks) == 1, f"{agent.name} runs {ranks}"
    return ranks[0]


def test_two_torchrun_agents_serve_the_single_process_completions_and_fail_loudly_without_rank_1(tmp_path):
    master_port, port = free_port(), free_port()
    agents = [Server(f"torchrun-node{node}", [
        str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
        "--master-addr", "127.0.0.1", "--master-port", str(master_port),
        str(BIN / "governor"), "serve", "--port", str(port), "--no-controller"], tmp_path, env=ENV)
        for node in (0, 1)]
    url = f"http://127.0.0.1:{port}"
    try:
        expected = single_process_texts()           # while the agents start
        agents[0].wait_ready(f"{url}/health", timeout=180)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:      # batched together on both ranks
            assert list(pool.map(lambda prompt: complete(url, prompt), PROMPTS)) == expected
        assert httpx.get(f"{url}/health").json() == {"status": "ok", "model": "governor-moe"}
        assert "expert-parallel rank 1 of 2" in agents[1].log()

        with ThreadPoolExecutor(1) as pool:     # kill -9 of rank 1 mid-request: a 5xx, and rank 0 exits for torchrun
            in_flight = pool.submit(complete_reply, url, PROMPTS[0], 400)
            time.sleep(0.5)
            os.kill(rank_process(agents[1]), signal.SIGKILL)
            failed = in_flight.result(timeout=60)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "expert_parallel_rank_failed"
        assert agents[0].process.wait(timeout=60) != 0       # no --max-restarts: torchrun gives up with rank 0
        assert "torchrun launched it, so this rank exits for torchrun to restart the group" in agents[0].log()
    finally:
        for agent in agents:
            agent.stop()
