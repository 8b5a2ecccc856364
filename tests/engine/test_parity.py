"""Our transformer's logits equal transformers' on the same weights (fp32, max abs diff <= 1e-4)."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.model.batch import SequenceChunk, build_forward_batch
from engine.model.hf_folder import load_transformer
from engine.model.kv_cache import KVCache
from governor.loaders import default_cache_dir, model_folder

TOLERANCE = 1e-4


def _our_logits(model, ids: list[int], split: int) -> torch.Tensor:
    """Prefill in two chunks, so the second one reads K/V the first wrote to the paged cache."""
    cache = KVCache(model.spec, 64 * 16, torch.float32, torch.device("cpu"))
    table = list(range(64))
    first = build_forward_batch([SequenceChunk(ids[:split], 0, table, 0)], 16, torch.device("cpu"))
    second = build_forward_batch([SequenceChunk(ids[split:], split, table, 0)], 16, torch.device("cpu"))
    return torch.cat([model(first, cache), model(second, cache)])


@pytest.mark.parametrize("name", ["governor-moe", "governor-draft", "smollm2-135m-instruct"])
def test_logits_match_transformers(name):
    folder = model_folder(name, default_cache_dir())
    ours = load_transformer(folder, torch.device("cpu"), torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, min(ours.spec.vocab_size, 256), (96,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = theirs(torch.tensor([ids])).logits[0]
    assert (_our_logits(ours, ids, split=40) - expected).abs().max().item() <= TOLERANCE
