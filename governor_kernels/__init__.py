"""Kernels with plain-PyTorch references of the same signature; the engine calls them through here, which picks
the Triton kernel where the tensors live on a CUDA device and triton imports, and the reference elsewhere."""
from governor_kernels import router, spec_verify
from governor_kernels.categorical import sample_categorical
from governor_kernels.dispatch import dispatched
from governor_kernels.router import Routing, expert_capacity

route_tokens = dispatched(router.route_tokens, "governor_kernels.router_triton")
verify_drafts = dispatched(spec_verify.verify_drafts, "governor_kernels.spec_verify_triton")

__all__ = ["Routing", "expert_capacity", "route_tokens", "sample_categorical", "verify_drafts"]
