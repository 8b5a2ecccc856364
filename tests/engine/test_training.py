"""The seeded training script runs end to end and writes folders that both loaders accept."""
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

from engine.model.hf_folder import load_transformer
from engine.model.tokenizer import ByteTokenizer, load_tokenizer


def test_training_script_smoke_run_writes_loadable_models(tmp_path):
    subprocess.run([sys.executable, "-m", "governor.training.train_bytelm", "--steps-target", "2", "--steps-draft", "2",
                    "--out", str(tmp_path)], check=True, timeout=600)
    for name in ("governor-moe", "governor-draft"):
        folder = tmp_path / name
        assert AutoModelForCausalLM.from_pretrained(folder) is not None
        assert load_transformer(folder, torch.device("cpu"), torch.float32).spec.vocab_size == 260
        assert isinstance(load_tokenizer(folder), ByteTokenizer)
