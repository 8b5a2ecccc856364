"""Kernels with plain-PyTorch references of the same signature; the engine calls them through here."""
from kernels.sampling import sample_categorical
from kernels.spec_verify import verify_drafts

__all__ = ["sample_categorical", "verify_drafts"]
