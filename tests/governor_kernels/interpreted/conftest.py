"""Fixtures for the Triton kernel checks, which run in a child process started with TRITON_INTERPRET=1 (see
tests/governor_kernels/test_triton_interpreted.py): Triton decides between compiling and interpreting as it is imported
and as each @triton.jit runs, so the flag has to be set before the process imports triton at all."""
import pytest


@pytest.fixture(scope="session")
def triton_verify():
    from governor_kernels.spec_verify_triton import verify_drafts
    return verify_drafts


@pytest.fixture(scope="session")
def triton_route():
    from governor_kernels.router_triton import route_tokens
    return route_tokens
