"""Inverse-CDF categorical sampling driven by caller-supplied uniforms, so the caller owns the randomness."""
from __future__ import annotations

import torch


def sample_categorical(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One index per row of non-negative weights [R, V] (need not sum to 1), for uniforms [R] in [0, 1)."""
    cdf = weights.cumsum(dim=-1)
    target = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return index.clamp_(max=weights.shape[-1] - 1)
