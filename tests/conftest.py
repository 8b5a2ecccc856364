import pytest
import torch

from governor.loaders import load_models


@pytest.fixture(scope="session")
def moe_models():
    """The shipped byte-level MoE target and its draft, on the CPU in fp32."""
    return load_models("governor-moe", device=torch.device("cpu"), dtype=torch.float32)
