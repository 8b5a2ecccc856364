"""Resolve model names and paths into loaded engine parts: the shipped models, HF folders, GGUF files."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import Engine, EngineLimits
from engine.experts import drop_logical_experts, expert_topology
from engine.loading import load_transformer
from engine.modeling import Transformer
from engine.spec import ModelFolderError
from engine.telemetry import TelemetrySink
from engine.tokenizer import Tokenizer, load_tokenizer

ASSETS = Path(__file__).parent / "assets"
DEFAULT_MODEL = "governor-moe"
SMOLLM2 = "smollm2-135m-instruct"
SHIPPED_FOLDERS = {"governor-moe": ASSETS / "governor-moe", "governor-draft": ASSETS / "governor-draft"}
DEFAULT_DRAFTS = {"governor-moe": "governor-draft", SMOLLM2: "self:20"}
# SmolLM2's untrained early exit accepts poorly (README), so it starts on prompt lookup.
DEFAULT_SPEC_METHODS = {SMOLLM2: "ngram"}
SHIPPED_NAMES = sorted([*SHIPPED_FOLDERS, SMOLLM2])


def default_cache_dir() -> Path:
    return Path(os.environ.get("GOVERNOR_CACHE_DIR") or Path.home() / ".cache" / "governor")


def pick_device() -> tuple[torch.device, torch.dtype]:
    """CUDA in bf16 where a GPU is present, else the CPU in fp32 (bf16 is several times slower there)."""
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def model_folder(name_or_path: str, cache_dir: Path) -> Path:
    """A Hugging Face folder for a shipped name, a folder path, or a GGUF file (converted once, cached)."""
    from engine import gguf

    if name_or_path in SHIPPED_FOLDERS:
        return SHIPPED_FOLDERS[name_or_path]
    if name_or_path == SMOLLM2:
        return gguf.cached_conversion(gguf.smollm2_gguf_path(), cache_dir)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return gguf.cached_conversion(path, cache_dir)
    if path.is_dir():
        return path
    raise ModelFolderError(f"model {name_or_path!r}: not a shipped model ({', '.join(SHIPPED_NAMES)}), "
                           "a model folder, or a .gguf file")


@dataclass
class LoadedModels:
    name: str
    target: Transformer
    tokenizer: Tokenizer
    draft: Transformer | None
    draft_name: str | None


def load_models(model: str = DEFAULT_MODEL, draft: str | None = None, cache_dir: Path | None = None,
                device: torch.device | None = None, dtype: torch.dtype | None = None) -> LoadedModels:
    """draft: a name or path, 'self:N' for the target's own first N layers, 'none', or None for the default."""
    cache_dir = cache_dir or default_cache_dir()
    if device is None:
        device, dtype = pick_device()
    folder = model_folder(model, cache_dir)
    target = load_transformer(folder, device, dtype)
    draft = DEFAULT_DRAFTS.get(model, "none") if draft is None else draft
    if draft == "none":
        draft_model = None
    elif draft.startswith("self:"):
        layers = draft.removeprefix("self:")
        if not layers.isdigit():
            raise ModelFolderError(f"draft {draft!r}: expected self:N with N a number of layers")
        draft_model = target.truncated(int(layers))
    else:
        draft_model = load_transformer(model_folder(draft, cache_dir), device, dtype)
    return LoadedModels(Path(model).name if model not in SHIPPED_NAMES else model, target,
                        load_tokenizer(folder), draft_model, None if draft == "none" else draft)


def build_engine(models: LoadedModels, config: EngineConfig | None = None, limits: EngineLimits = EngineLimits(),
                 ep: int = 1, redundant_experts: int = 0, model: str = DEFAULT_MODEL,
                 sinks: Sequence[TelemetrySink] = ()) -> Engine:
    """ep > 1 spawns ep - 1 worker ranks that load `model` themselves; the target then keeps only rank 0's
    expert slots. Raises ValueError for a combination that cannot be served (e.g. ep > 1 on a dense model)."""
    if config is None:
        fallback = "draft_model" if models.draft is not None else "ngram"
        config = EngineConfig(spec_method=DEFAULT_SPEC_METHODS.get(models.name, fallback))
    if not models.target.moe_blocks:
        if ep > 1 or redundant_experts:
            raise ValueError(f"--ep and --redundant-experts need an MoE model; {models.name} is dense")
        return Engine(models.target, models.tokenizer, models.draft, config, limits, sinks)
    if ep == 1:
        topology = expert_topology(models.target.spec.num_experts, 1, redundant_experts)
        return Engine(models.target, models.tokenizer, models.draft, config, limits, sinks, topology=topology)
    from engine.ep import ExpertParallel

    group = ExpertParallel(model, ep, models.target, limits, redundant_experts=redundant_experts)
    try:
        engine = Engine(models.target, models.tokenizer, models.draft, config, limits, sinks, ep=group)
    except Exception:
        group.close()
        raise
    drop_logical_experts(models.target)
    return engine
