"""The Triton router kernel, run by Triton's CPU interpreter, routes exactly as the reference does."""
import pytest
import torch

from governor_kernels.router import route_tokens


def assert_same(triton_route, logits: torch.Tensor, top_k: int):
    got, want = triton_route(logits, top_k), route_tokens(logits, top_k)
    assert got.experts.tolist() == want.experts.tolist()
    assert got.counts.tolist() == want.counts.tolist()
    assert got.slots.tolist() == want.slots.tolist()
    torch.testing.assert_close(got.weights, want.weights, rtol=1e-6, atol=1e-7)
    return want


@pytest.mark.parametrize("tokens,experts,top_k", [(70, 8, 2), (45, 6, 2), (33, 13, 3), (5, 3, 1), (20, 40, 8)])
def test_random_logits_match_the_reference(triton_route, tokens, experts, top_k):
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens))
    assert_same(triton_route, logits, top_k)


def test_ties_go_to_the_lowest_expert_index(triton_route):
    logits = torch.randint(0, 3, (40, 7), generator=torch.Generator().manual_seed(0)).float()
    routing = assert_same(triton_route, logits, 3)
    ranked = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :3]
    assert routing.experts.tolist() == ranked.tolist()
    assert triton_route(torch.zeros(2, 5), 2).experts.tolist() == [[0, 1], [0, 1]]


def test_slots_count_first_choices_of_every_token_before_second_choices(triton_route):
    logits = torch.tensor([[5.0, 4, 0], [5, 4, 0], [4, 5, 0]] * 20)        # 60 tokens: two blocks of 32
    routing = assert_same(triton_route, logits, 2)
    first_of_expert_0 = (routing.experts[:, 0] == 0).sum().item()
    assert routing.slots[2, 1].item() == first_of_expert_0                 # token 2's second choice is expert 0
    assert routing.counts.tolist() == [60, 60, 0]


def test_empty_batch(triton_route):
    routing = triton_route(torch.zeros(0, 6), 2)
    assert routing.experts.shape == (0, 2) and routing.counts.tolist() == [0] * 6
