"""Resolve model names and paths into loaded engine parts: the shipped models, HF folders, GGUF files."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.factory import LoadedModels
from engine.model.hf_folder import load_transformer
from engine.model.model_spec import ModelFolderError
from engine.model.tokenizer import load_tokenizer
from engine.model.transformer import Transformer
from governor.registry import DEFAULT_MODEL, MODELS, SHIPPED_NAMES


def default_cache_dir() -> Path:
    return Path(os.environ.get("GOVERNOR_CACHE_DIR") or Path.home() / ".cache" / "governor")


def pick_device() -> tuple[torch.device, torch.dtype]:
    """CUDA in bf16 where a GPU is present, else the CPU in fp32 (bf16 is several times slower there)."""
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def model_folder(name_or_path: str, cache_dir: Path) -> Path:
    """A Hugging Face folder for a shipped name, a folder path, or a GGUF file (converted once, cached)."""
    from engine.model import gguf  # heavy (transformers, gguf) and needed only for GGUF models

    if name_or_path in MODELS:
        folder = MODELS[name_or_path].folder
        return folder if folder is not None else gguf.cached_conversion(gguf.smollm2_gguf_path(), cache_dir)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return gguf.cached_conversion(path, cache_dir)
    if path.is_dir():
        return path
    raise ModelFolderError(f"model {name_or_path!r}: not a shipped model ({', '.join(SHIPPED_NAMES)}), "
                           "a model folder, or a .gguf file")


@dataclass(frozen=True)
class TargetLoader:
    """Loads a model's target alone, e.g. in a spawned expert-parallel rank (picklable, unlike the models)."""
    model: str
    cache_dir: Path

    def __call__(self, device: torch.device, dtype: torch.dtype) -> Transformer:
        return load_transformer(model_folder(self.model, self.cache_dir), device, dtype)


def load_models(model: str = DEFAULT_MODEL, draft: str | None = None, cache_dir: Path | None = None,
                device: torch.device | None = None, dtype: torch.dtype | None = None) -> LoadedModels:
    """draft: a name or path, 'self:N' for the target's own first N layers, 'none', or None for the default."""
    cache_dir = cache_dir or default_cache_dir()
    if device is None:
        device, dtype = pick_device()
    folder = model_folder(model, cache_dir)
    target = load_transformer(folder, device, dtype)
    shipped = MODELS.get(model)
    draft = (shipped.draft if shipped else "none") if draft is None else draft
    if draft == "none":
        draft_model = None
    elif draft.startswith("self:"):
        layers = draft.removeprefix("self:")
        if not layers.isdigit():
            raise ModelFolderError(f"draft {draft!r}: expected self:N with N a number of layers")
        draft_model = target.truncated(int(layers))
    else:
        draft_model = load_transformer(model_folder(draft, cache_dir), device, dtype)
    spec_method = (shipped and shipped.spec_method) or ("draft_model" if draft_model is not None else "ngram")
    return LoadedModels(model if shipped else Path(model).name, target, load_tokenizer(folder), draft_model,
                        None if draft == "none" else draft, spec_method, TargetLoader(model, cache_dir))
