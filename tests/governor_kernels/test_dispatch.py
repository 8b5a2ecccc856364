"""The engine's entry points pick the reference on the CPU and the Triton kernel on a CUDA device."""
import pytest
import torch

import governor_kernels
from governor_kernels import router, spec_verify
from governor_kernels.dispatch import uses_triton

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def verify_inputs(device: str):
    g = torch.Generator().manual_seed(0)
    p = torch.rand(8, 4, 50, generator=g)
    q = torch.rand(8, 3, 50, generator=g)
    args = (torch.randint(0, 50, (8, 3), generator=g), torch.randint(0, 4, (8,), generator=g),
            q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True), torch.rand(8, 3, generator=g),
            torch.rand(8, generator=g))
    return [a.to(device) for a in args]


def test_cpu_tensors_take_the_reference():
    assert not uses_triton(torch.zeros(1))
    logits = torch.randn(9, 6, generator=torch.Generator().manual_seed(0))
    assert governor_kernels.route_tokens(logits, 2).slots.tolist() == router.route_tokens(logits, 2).slots.tolist()
    got, want = governor_kernels.verify_drafts(*verify_inputs("cpu")), spec_verify.verify_drafts(*verify_inputs("cpu"))
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


@CUDA
def test_cuda_tensors_take_triton_and_match_the_reference_on_the_cpu():
    assert uses_triton(torch.zeros(1, device="cuda"))
    logits = torch.randint(0, 4, (300, 60), generator=torch.Generator().manual_seed(0)).float()   # many ties
    got, want = governor_kernels.route_tokens(logits.cuda(), 4), router.route_tokens(logits, 4)
    assert got.experts.tolist() == want.experts.tolist() and got.slots.tolist() == want.slots.tolist()
    accepted, token = governor_kernels.verify_drafts(*verify_inputs("cuda"))
    want_accepted, want_token = spec_verify.verify_drafts(*verify_inputs("cpu"))
    assert accepted.tolist() == want_accepted.tolist() and token.tolist() == want_token.tolist()
