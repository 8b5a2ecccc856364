"""Load a Hugging Face model folder (config.json + safetensors) into the engine's Transformer."""
from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.model_spec import ModelFolderError, ModelSpec
from engine.model.transformer import Transformer

_LEGACY_EXPERT = re.compile(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight")


def load_transformer(folder: Path, device: torch.device, dtype: torch.dtype) -> Transformer:
    """The model for serving: in eval mode, its parameters needing no gradient (slices of them, such as an
    expert-parallel rank's slots, would otherwise keep autograd graphs, and with them the whole tensors, alive)."""
    spec = ModelSpec.from_folder(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"{folder}: no *.safetensors weight files")
    with torch.device("meta"):
        model = Transformer(spec)
    state = _engine_state_dict(_read_tensors(files), spec)
    expected = {k for k in model.state_dict() if not (spec.tie_word_embeddings and k == "lm_head.weight")}
    missing = sorted(expected - state.keys())
    if missing:
        raise ModelFolderError(f"{folder}: weights missing for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items() if k in expected}, strict=False, assign=True)
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary = type(model.rotary)(spec)
    return model.to(device).eval().requires_grad_(False)


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name)
    return tensors


def _engine_state_dict(tensors: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Map Hugging Face names onto the engine's (strip 'model.'; stack Mixtral experts)."""
    state, experts = {}, {}
    for name, tensor in tensors.items():
        if legacy := _LEGACY_EXPERT.fullmatch(name):
            layer, expert, which = int(legacy[1]), int(legacy[2]), legacy[3]
            experts.setdefault((layer, which), {})[expert] = tensor
        elif name.endswith("mlp.experts.gate_up_proj"):
            prefix = _engine_name(name.removesuffix("experts.gate_up_proj"))
            gate, up = tensor.chunk(2, dim=1)
            state[prefix + "w1"], state[prefix + "w3"] = gate, up
        elif name.endswith("mlp.experts.down_proj"):
            state[_engine_name(name.removesuffix("experts.down_proj")) + "w2"] = tensor
        else:
            state[_engine_name(name)] = tensor
    for (layer, which), by_expert in experts.items():
        if sorted(by_expert) != list(range(spec.num_experts)):
            raise ModelFolderError(f"layer {layer}: expert weights {which} incomplete ({len(by_expert)} of {spec.num_experts})")
        state[f"layers.{layer}.mlp.{which}"] = torch.stack([by_expert[e] for e in range(spec.num_experts)])
    return state


def _engine_name(name: str) -> str:
    name = name.removeprefix("model.")
    return name.replace(".block_sparse_moe.", ".mlp.")
