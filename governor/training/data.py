"""Byte-level corpus built from the Python standard library's own source files."""

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import torch

BOS, EOS, PAD = 256, 257, 258
VOCAB_SIZE = 260
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})
SPLITS = ("train", "heldout")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    return hashlib.sha1(relpath.encode()).hexdigest()[-1] == "0"


def stdlib_files(split: str) -> list[Path]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        if is_heldout(rel.as_posix()) == (split == "heldout"):
            files.append(path)
    return files


def encode_files(files: list[Path]) -> torch.Tensor:
    """<bos> bytes <eos> for every file, concatenated."""
    chunks = []
    for path in files:
        chunks.append(np.array([BOS], dtype=np.int64))
        chunks.append(np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.int64))
        chunks.append(np.array([EOS], dtype=np.int64))
    return torch.from_numpy(np.concatenate(chunks))


def random_windows(corpus: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(corpus) - seq_len, (batch_size,), generator=generator)
    return torch.stack([corpus[s : s + seq_len] for s in starts.tolist()])


def evenly_spaced_windows(corpus: torch.Tensor, seq_len: int, count: int | None = None) -> torch.Tensor:
    windows = corpus[: len(corpus) // seq_len * seq_len].view(-1, seq_len)
    if count is None or count >= len(windows):
        return windows
    return windows[torch.linspace(0, len(windows) - 1, count).long()]
