"""Held-out measurements of byte-level models: bits per byte, expert load, greedy draft acceptance."""

import math
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from governor.training.data import evenly_spaced_windows


def load_fp32(path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def bits_per_byte(
    model: PreTrainedModel, corpus: torch.Tensor, seq_len: int = 512, windows: int = 128, batch_size: int = 8
) -> float:
    batches = evenly_spaced_windows(corpus, seq_len, windows).split(batch_size)
    total_nats = 0.0
    predicted = 0
    for batch in batches:
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1]
        targets = batch[:, 1:]
        total_nats += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum").item()
        predicted += targets.numel()
    return total_nats / predicted / math.log(2)


@torch.no_grad()
def expert_token_share(
    model: PreTrainedModel, corpus: torch.Tensor, seq_len: int = 512, windows: int = 32
) -> list[list[float]]:
    batch = evenly_spaced_windows(corpus, seq_len, windows)
    router_logits = model(input_ids=batch, output_router_logits=True, use_cache=False).router_logits
    top_k = model.config.num_experts_per_tok
    shares = []
    for layer_logits in router_logits:
        chosen = layer_logits.topk(top_k, dim=-1).indices.flatten()
        counts = torch.bincount(chosen, minlength=layer_logits.shape[-1]).float()
        shares.append([round(x, 4) for x in (counts / counts.sum()).tolist()])
    return shares


def heldout_contexts(files: list[Path], count: int, length: int, seed: int) -> list[torch.Tensor]:
    rng = random.Random(seed)
    candidates = [data for data in (f.read_bytes() for f in files) if len(data) > length]
    contexts = []
    for _ in range(count):
        data = rng.choice(candidates)
        start = rng.randrange(len(data) - length)
        contexts.append(torch.tensor(list(data[start : start + length])))
    return contexts


def greedy_continue(model: PreTrainedModel, cache: DynamicCache, tokens: torch.Tensor) -> torch.Tensor:
    """Greedy next token after every position of `tokens` that `cache` does not hold yet."""
    unseen = tokens[cache.get_seq_length() :]
    return model(input_ids=unseen[None], cache=cache, use_cache=True).logits[0].argmax(-1)


def truncate(cache: DynamicCache, length: int) -> None:
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def draft_greedy(draft: PreTrainedModel, cache: DynamicCache, tokens: torch.Tensor, k: int) -> torch.Tensor:
    for _ in range(k):
        tokens = torch.cat([tokens, greedy_continue(draft, cache, tokens)[-1:]])
    return tokens[-k:]


def accepted_prefix(proposal: torch.Tensor, verified: torch.Tensor) -> int:
    mismatches = (proposal != verified).nonzero()
    return int(mismatches[0]) if len(mismatches) else len(proposal)


@torch.no_grad()
def greedy_acceptance(
    target: PreTrainedModel, draft: PreTrainedModel, contexts: list[torch.Tensor], k: int = 4, new_tokens: int = 64
) -> float:
    """Share of drafted tokens the target accepts when both decode greedily, k drafted per verification."""
    accepted = drafted = 0
    for context in contexts:
        tokens = context
        target_cache, draft_cache = DynamicCache(config=target.config), DynamicCache(config=draft.config)
        while len(tokens) - len(context) < new_tokens:
            proposal = draft_greedy(draft, draft_cache, tokens, k)
            start = len(tokens) - 1 - target_cache.get_seq_length()
            verified = greedy_continue(target, target_cache, torch.cat([tokens, proposal]))[start:]
            n = accepted_prefix(proposal, verified[:k])
            tokens = torch.cat([tokens, proposal[:n], verified[n : n + 1]])
            truncate(target_cache, len(tokens) - 1)
            truncate(draft_cache, len(tokens) - 1)
            accepted += n
            drafted += k
    return accepted / drafted
