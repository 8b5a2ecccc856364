"""Kernels with plain-PyTorch references of the same signature; the engine calls them through here."""
from kernels.router import Routing, expert_capacity, route_tokens
from kernels.sampling import sample_categorical
from kernels.spec_verify import verify_drafts

__all__ = ["Routing", "expert_capacity", "route_tokens", "sample_categorical", "verify_drafts"]
