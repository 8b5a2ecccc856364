"""`governor bench spec`'s peer: Hugging Face transformers on the very weights the engine loaded, with `generate`,
assisted generation (draft model) and prompt lookup (n-gram)."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from engine.factory import LoadedModels
from governor.bench import report
from governor.loaders import default_cache_dir, model_folder, pick_device

WARM_UP_TOKENS = 8
PEER_NAMES = {"draft_model": "HF assisted generation", "ngram": "HF prompt lookup"}
ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def hf_models(models: LoadedModels):
    """The target and draft as transformers models, from the very folders (and layers) the engine loaded."""
    folder = model_folder(models.name, default_cache_dir())
    target = _hf_load(folder)
    if models.draft_name is None:
        return target, None
    if models.draft_name.startswith("self:"):
        return target, _hf_load(folder, num_hidden_layers=int(models.draft_name.removeprefix("self:")))
    return target, _hf_load(model_folder(models.draft_name, default_cache_dir()))


def _hf_load(folder: Path, **overrides):
    from transformers import AutoModelForCausalLM

    device, dtype = pick_device()
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **overrides).to(device).eval()


def hf_peer(name: str, hf_target, hf_draft, prompts: list[list[int]], max_tokens: int, method: str,
            best_k: int) -> dict:
    """The transformers counterpart of our drafter `method` at batch 1: assisted generation or prompt lookup."""
    if method == "draft_model":
        settings = _assistant_settings(hf_draft)
        options = {"assistant_model": hf_draft}
    else:
        settings = options = {"prompt_lookup_num_tokens": best_k}
    tokens_per_second = hf_tokens_per_second(hf_target, prompts, max_tokens, **options)
    report.progress(f"{name}  {PEER_NAMES[method]}  {tokens_per_second:8.1f} tok/s at batch 1  {settings}")
    return {"name": PEER_NAMES[method], "settings": settings, "tokens_per_second": tokens_per_second}


def _assistant_settings(hf_draft) -> dict:
    """What assisted generation will use: the draft's generation config, else transformers' own defaults."""
    config = hf_draft.generation_config
    defaults = config._get_default_generation_params()
    return {name: defaults[name] if getattr(config, name) is None else getattr(config, name)
            for name in ASSISTANT_SETTINGS}


def hf_tokens_per_second(model, prompts: list[list[int]], max_tokens: int, **options) -> float:
    _hf_generate(model, prompts[0], WARM_UP_TOKENS, options)
    started = time.perf_counter()
    tokens = sum(_hf_generate(model, ids, max_tokens, options) for ids in prompts)
    return tokens / (time.perf_counter() - started)


def _hf_generate(model, prompt_ids: list[int], max_tokens: int, options: dict) -> int:
    input_ids = torch.tensor([prompt_ids], device=model.device)
    output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                            max_new_tokens=max_tokens, min_new_tokens=max_tokens, **options)
    return output.shape[1] - input_ids.shape[1]


