"""ModelSpec: the architecture facts the engine needs, read from a Hugging Face config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MixtralForCausalLM": "mixtral"}


class ModelFolderError(ValueError):
    """A model folder that cannot be loaded; the message names the file and the problem."""


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    num_experts: int = 0
    experts_per_token: int = 0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def with_layers(self, num_layers: int) -> ModelSpec:
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(f"num_layers must be in 1..{self.num_layers}, got {num_layers}")
        return ModelSpec(**{**self.__dict__, "num_layers": num_layers})

    @classmethod
    def from_folder(cls, folder: Path) -> ModelSpec:
        path = folder / "config.json"
        if not path.is_file():
            raise ModelFolderError(f"{folder}: no config.json (expected a Hugging Face model folder)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ModelFolderError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_hf_config(raw, source=str(path))

    @classmethod
    def from_hf_config(cls, raw: dict, source: str = "config.json") -> ModelSpec:
        archs = raw.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelFolderError(
                f"{source}: architectures={archs!r} is not supported; "
                f"allowed: {sorted(SUPPORTED_ARCHITECTURES)}")
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            eos = raw.get("eos_token_id")
            return cls(
                arch=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=_rope_theta(raw),
                max_position=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                num_experts=int(raw.get("num_local_experts", 0)) if arch == "mixtral" else 0,
                experts_per_token=int(raw.get("num_experts_per_tok", 0)) if arch == "mixtral" else 0,
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            )
        except KeyError as exc:
            raise ModelFolderError(f"{source}: missing field {exc.args[0]!r}") from exc


def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ModelFolderError(f"config.json: rope type {rope_type!r} is not supported; allowed: 'default'")
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
