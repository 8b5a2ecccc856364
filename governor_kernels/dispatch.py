"""Triton where the first tensor argument lives on a CUDA device and triton imports; the reference elsewhere."""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TypeVar

import torch

Kernel = TypeVar("Kernel", bound=Callable)


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def uses_triton(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and triton_available()


def dispatched(reference: Kernel, triton_module: str) -> Kernel:
    """reference, or the function of the same name in triton_module (imported on first use) for CUDA tensors."""
    @functools.wraps(reference)
    def call(first: torch.Tensor, *args, **kwargs):
        if uses_triton(first):
            return getattr(importlib.import_module(triton_module), reference.__name__)(first, *args, **kwargs)
        return reference(first, *args, **kwargs)
    return call
