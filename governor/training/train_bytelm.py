"""Train the shipped byte-level default models: a Mixtral-style MoE target and a Llama draft distilled from it.

python -m governor.training.train_bytelm [--out engine/assets] [--steps-target N] [--steps-draft N] [--seed 0]
"""

import argparse
import json
import math
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, PreTrainedModel

from governor.registry import ASSETS
from governor.training.data import BOS, EOS, PAD, VOCAB_SIZE, encode_files, random_windows, stdlib_files
from governor.training.evaluate import bits_per_byte, expert_token_share, greedy_acceptance, heldout_contexts, load_fp32

SEQ_LEN = 512
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
SPECIAL_TOKENS = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}
DEFAULT_OUT = ASSETS
HARD_LABEL_WEIGHT = 0.1
BYTE_TOKENIZER_MARKER = {"tokenizer": "bytes"}

LossFn = Callable[[PreTrainedModel, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


# what target and draft share: the byte vocabulary, the context, the rope and the special tokens
SHARED_CONFIG = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=SEQ_LEN, rope_parameters=ROPE,
                     tie_word_embeddings=False, **SPECIAL_TOKENS)


def target_config() -> MixtralConfig:
    return MixtralConfig(hidden_size=192, intermediate_size=448, num_hidden_layers=4, num_attention_heads=6,
                         num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, output_router_logits=True,
                         router_aux_loss_coef=0.01, **SHARED_CONFIG)


def draft_config() -> LlamaConfig:
    return LlamaConfig(hidden_size=160, intermediate_size=512, num_hidden_layers=2, num_attention_heads=5,
                       num_key_value_heads=1, **SHARED_CONFIG)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def adamw(model: PreTrainedModel, lr: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def format_seconds(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s"


def report_progress(name: str, step: int, steps: int, metrics: dict[str, float], tokens: int, started: float) -> None:
    elapsed = time.time() - started
    figures = "  ".join(f"{key} {value:.4f}" for key, value in metrics.items())
    eta = elapsed / step * (steps - step)
    print(
        f"[{name}] step {step}/{steps}  {figures}  {tokens / elapsed:.0f} tok/s  "
        f"elapsed {format_seconds(elapsed)}  ETA {format_seconds(eta)}",
        flush=True,
    )


def train(
    name: str,
    model: PreTrainedModel,
    loss_fn: LossFn,
    corpus: torch.Tensor,
    steps: int,
    batch_size: int,
    peak_lr: float,
    seed: int,
) -> dict[str, float]:
    generator = torch.Generator().manual_seed(seed)
    optimizer = adamw(model, peak_lr)
    warmup = max(1, min(100, steps // 10))
    recent: list[dict[str, float]] = []
    started, last_print = time.time(), 0.0
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr, warmup)
        loss, metrics = loss_fn(model, random_windows(corpus, batch_size, SEQ_LEN, generator))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent = (recent + [metrics])[-20:]
        if step + 1 == steps or time.time() - last_print >= 10:
            last_print = time.time()
            report_progress(name, step + 1, steps, metrics, (step + 1) * batch_size * SEQ_LEN, started)
    model.eval()
    return {key: sum(m[key] for m in recent) / len(recent) for key in recent[0]}


def language_model_loss(model: PreTrainedModel, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    out = model(input_ids=batch, labels=batch, use_cache=False)
    return out.loss, {"loss": (out.loss - model.config.router_aux_loss_coef * out.aux_loss).item()}


def distillation_loss(target: PreTrainedModel) -> LossFn:
    def loss_fn(draft: PreTrainedModel, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=batch, use_cache=False).logits, dim=-1)
        logits = draft(input_ids=batch, use_cache=False).logits
        student = F.log_softmax(logits, dim=-1)
        kl = F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")
        hard = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
        return kl + HARD_LABEL_WEIGHT * hard, {"loss": hard.item(), "kl": kl.item()}

    return loss_fn


def save_fp16(model: PreTrainedModel, path: Path) -> None:
    model.config.output_router_logits = False
    model.half().save_pretrained(path, safe_serialization=True)
    (path / "governor.json").write_text(json.dumps(BYTE_TOKENIZER_MARKER) + "\n")


def parameter_count(model: PreTrainedModel) -> int:
    return sum(p.numel() for p in model.parameters())


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps-target", type=int, default=700)
    parser.add_argument("--steps-draft", type=int, default=600)
    parser.add_argument("--batch-target", type=int, default=8)
    parser.add_argument("--batch-draft", type=int, default=8)
    parser.add_argument("--eval-contexts", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(2)
    seed_everything(args.seed)
    started = time.time()
    train_files, heldout_files = stdlib_files("train"), stdlib_files("heldout")
    train_corpus, heldout_corpus = encode_files(train_files), encode_files(heldout_files)
    print(
        f"data: {len(train_files)} train files ({len(train_corpus)} tokens), "
        f"{len(heldout_files)} held-out files ({len(heldout_corpus)} tokens)",
        flush=True,
    )

    target = MixtralForCausalLM(target_config())
    target_train = train(
        "target", target, language_model_loss, train_corpus, args.steps_target, args.batch_target, 2e-3, args.seed
    )
    target_seconds = time.time() - started
    save_fp16(target, args.out / "governor-moe")
    target = load_fp32(args.out / "governor-moe")

    draft = LlamaForCausalLM(draft_config())
    draft_train = train(
        "draft", draft, distillation_loss(target), train_corpus, args.steps_draft, args.batch_draft, 3e-3, args.seed + 1
    )
    draft_seconds = time.time() - started - target_seconds
    save_fp16(draft, args.out / "governor-draft")
    draft = load_fp32(args.out / "governor-draft")

    print("evaluating held-out bits per byte and greedy acceptance ...", flush=True)
    contexts = heldout_contexts(heldout_files, args.eval_contexts, 192, args.seed)
    acceptance = greedy_acceptance(target, draft, contexts, k=4, new_tokens=64)
    report = {
        "seed": args.seed,
        "data": {
            "source": f"Python {platform.python_version()} standard library .py files "
            "(excluding site-packages, test, tests, idlelib, lib2to3), each as <bos> bytes <eos>",
            "heldout_rule": "sha1(relative path) last hex digit == '0'",
            "train_files": len(train_files),
            "train_bytes": len(train_corpus) - 2 * len(train_files),
            "heldout_files": len(heldout_files),
            "heldout_bytes": len(heldout_corpus) - 2 * len(heldout_files),
            "bits_per_byte_measured_on": f"128 evenly spaced {SEQ_LEN}-token windows of the held-out stream",
        },
        "target": {
            "class": "MixtralForCausalLM",
            "params": parameter_count(target),
            "steps": args.steps_target,
            "batch": [args.batch_target, SEQ_LEN],
            "final_train_loss_nats_last20": round(target_train["loss"], 4),
            "heldout_bits_per_byte": round(bits_per_byte(target, heldout_corpus), 4),
            "expert_token_share": expert_token_share(target, heldout_corpus),
            "wall_seconds": round(target_seconds, 1),
        },
        "draft": {
            "class": "LlamaForCausalLM",
            "params": parameter_count(draft),
            "steps": args.steps_draft,
            "batch": [args.batch_draft, SEQ_LEN],
            "distillation": f"KL(target||draft) at T=1 + {HARD_LABEL_WEIGHT} x hard-label CE",
            "final_train_loss_nats_last20": round(draft_train["loss"], 4),
            "final_train_kl_last20": round(draft_train["kl"], 4),
            "heldout_bits_per_byte": round(bits_per_byte(draft, heldout_corpus), 4),
            "wall_seconds": round(draft_seconds, 1),
        },
        "greedy_acceptance": {
            "k": 4,
            "contexts": len(contexts),
            "context_bytes": 192,
            "new_tokens": 64,
            "weights": "fp16 as saved, evaluated in fp32",
            "rate": round(acceptance, 4),
        },
        "sizes_bytes": {name: folder_bytes(args.out / name) for name in ("governor-moe", "governor-draft")},
        "wall_seconds": round(time.time() - started, 1),
    }
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
