import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from engine.model.gguf import SOURCE_RECORD, cached_conversion, convert_gguf, smollm2_gguf_path

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def source() -> Path:
    return smollm2_gguf_path()


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory) -> Path:
    return cached_conversion(source, tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(converted):
    return AutoTokenizer.from_pretrained(converted)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> torch.Tensor:
    return tokenizer(PROMPT, return_tensors="pt").input_ids


@pytest.fixture(scope="module")
def converted_model(converted):
    return LlamaForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()


def transformers_gguf_model(source: Path):
    """What `from_pretrained(..., gguf_file=...)` does for this file, without its `accelerate` requirement."""
    config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(source, return_tensors=True, model_to_load=model)["tensors"]
    keys = model.load_state_dict(tensors, strict=False)
    assert keys.unexpected_keys == [] and keys.missing_keys == ["lm_head.weight"]
    return model.eval()


@torch.no_grad()
def test_logits_match_transformers_own_gguf_loading(source, converted_model, prompt_ids):
    reference = transformers_gguf_model(source)
    diff = (converted_model(prompt_ids).logits - reference(prompt_ids).logits).abs().max().item()
    print(f"max abs logits diff: {diff:.3e}")
    assert diff <= 1e-4


@torch.no_grad()
def test_converted_model_knows_a_simple_fact(converted_model, tokenizer, prompt_ids):
    next_id = converted_model(prompt_ids).logits[0, -1].argmax().item()
    assert tokenizer.decode(next_id).strip() == "Paris"


def test_config_ties_embeddings_when_gguf_has_no_output_tensor(converted):
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True


def test_tokenizer_round_trips_text(tokenizer):
    text = "Governor keeps speculation honest: 42 tokens/s, naïve café."
    assert tokenizer.decode(tokenizer(text).input_ids) == text


def test_chat_template_renders_smollm2_markers(tokenizer):
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi there<|im_end|>\n" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


def test_second_cached_conversion_reuses_the_folder(source, converted, capsys):
    before = (converted.stat().st_ino, (converted / "model.safetensors").stat().st_mtime_ns)
    again = cached_conversion(source, converted.parent)
    after = (again.stat().st_ino, (again / "model.safetensors").stat().st_mtime_ns)
    assert (again, after) == (converted, before)
    assert "converting" not in capsys.readouterr().err


def test_partial_cache_folder_is_rebuilt(source, tmp_path):
    partial = tmp_path / source.stem
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    rebuilt = cached_conversion(source, tmp_path)
    assert rebuilt == partial
    assert (rebuilt / "model.safetensors").is_file()
    assert json.loads((rebuilt / SOURCE_RECORD).read_text())["source"] == source.name
    assert [p.name for p in tmp_path.iterdir()] == [source.stem]


def test_garbage_file_is_refused(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        convert_gguf(garbage, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_non_llama_architecture_is_refused(tmp_path):
    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        convert_gguf(path, tmp_path / "out")
