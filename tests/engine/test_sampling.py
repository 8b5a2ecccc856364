"""Sampled speculative output follows the target's distribution (chi-square, significance 0.001)."""
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine.model.batch import SequenceChunk, build_forward_batch
from engine.model.kv_cache import KVCache
from engine.runtime.limits import EngineLimits
from engine.runtime.sampling import probs_from_logits
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import make_engine

SAMPLES = 3000
SIGNIFICANCE = 1e-3
MIN_CONDITIONED = 300
PROMPT = "    def __repr__(self):\n        return "


def _target_distribution(model, ids: list[int], temperature: float, top_p: float) -> np.ndarray:
    cache = KVCache(model.spec, 16 * (len(ids) // 16 + 1), torch.float32, torch.device("cpu"))
    batch = build_forward_batch([SequenceChunk(ids, 0, list(range(len(ids) // 16 + 1)), len(ids) - 1)], 16,
                                torch.device("cpu"))
    logits = model(batch, cache)
    return probs_from_logits(logits, torch.tensor([temperature]), torch.tensor([top_p]))[0].numpy()


def _chi_square_p(observed: Counter, expected_probs: np.ndarray) -> float:
    n = sum(observed.values())
    expected = expected_probs.astype(np.float64) / expected_probs.sum(dtype=np.float64) * n
    big = np.flatnonzero(expected >= 5)
    small = np.setdiff1d(np.arange(len(expected)), big)
    observed_bins = [observed.get(int(t), 0) for t in big] + [sum(observed.get(int(t), 0) for t in small)]
    expected_bins = list(expected[big]) + [expected[small].sum()]
    if expected_bins[-1] < 1e-9:
        assert observed_bins[-1] == 0, "sampled a token the target gives zero probability"
        observed_bins, expected_bins = observed_bins[:-1], expected_bins[:-1]
    if len(observed_bins) == 1:
        return 1.0  # a single possible token, and the assertion above saw nothing else sampled
    expected_bins = np.asarray(expected_bins)
    return chisquare(observed_bins, expected_bins * sum(observed_bins) / expected_bins.sum()).pvalue


@pytest.mark.parametrize("spec_method, temperature, top_p", [("draft_model", 1.0, 1.0), ("draft_model", 0.8, 0.9),
                                                             ("ngram", 1.0, 1.0)])
def test_sampled_speculative_tokens_follow_the_target_distribution(moe_models, spec_method, temperature, top_p):
    prompt = moe_models.tokenizer.encode(PROMPT)
    engine = make_engine(moe_models, EngineConfig(spec_method=spec_method, draft_len=3),
                         EngineLimits(kv_cache_tokens=65536, max_num_seqs=256, max_batch_tokens=4096))
    outputs = []
    for seed in range(0, SAMPLES, 500):
        params = [SamplingParams(max_tokens=4, temperature=temperature, top_p=top_p, seed=seed + i, ignore_eos=True)
                  for i in range(500)]
        outputs += _generate_each(engine, prompt, params)
    assert engine.snapshot().accepted_tokens > 0
    for position in (1, 2, 3):
        prefix, _ = Counter(tuple(o[:position]) for o in outputs).most_common(1)[0]
        following = Counter(o[position] for o in outputs if tuple(o[:position]) == prefix)
        assert sum(following.values()) >= MIN_CONDITIONED
        expected = _target_distribution(moe_models.target, prompt + list(prefix), temperature, top_p)
        assert _chi_square_p(following, expected) > SIGNIFICANCE


def _generate_each(engine, prompt, params_list):
    for i, params in enumerate(params_list):
        engine.add_request(str(i), prompt, params)
    outputs: dict[str, list[int]] = {}
    while engine.has_work:
        for emission in engine.step():
            outputs.setdefault(emission.request_id, []).extend(emission.token_ids)
    return [outputs[str(i)] for i in range(len(params_list))]
