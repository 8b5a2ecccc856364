"""`governor serve` launched by torchrun as if on two nodes: two agents on loopback, one process each. Rank 0 serves
HTTP with half of the experts, rank 1 holds the other half, and greedy completions equal the single process's."""
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from engine.engine import Engine
from engine.limits import EngineLimits
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


def complete(url: str, prompt: str) -> str:
    reply = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "governor-moe", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def test_two_torchrun_agents_serve_the_single_process_completions(tmp_path):
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
        assert agents[1].process.poll() is None
    finally:
        for agent in agents:
            agent.stop()
    with pytest.raises(httpx.ConnectError):        # stopping the agents stopped rank 0 too
        httpx.get(f"{url}/health")
