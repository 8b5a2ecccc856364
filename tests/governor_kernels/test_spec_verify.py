"""The verification reference: accept mask, first rejection, recovered and bonus tokens."""
import torch

from governor_kernels import sample_categorical, verify_drafts

V = 5


def _one_hot(tokens: list[list[int]]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


def test_greedy_accepts_the_matching_prefix_and_recovers_the_target_argmax():
    target = _one_hot([[1, 2, 3, 4]])            # target's argmax at each of k+1 = 4 positions
    drafts = torch.tensor([[1, 2, 0]])           # third draft disagrees
    accepted, token = verify_drafts(drafts, torch.tensor([3]), _one_hot([[1, 2, 0]]), target,
                                    torch.full((1, 3), 0.5), torch.tensor([0.5]))
    assert accepted.tolist() == [2] and token.tolist() == [3]


def test_all_accepted_samples_the_bonus_token_from_the_next_position():
    target = _one_hot([[1, 2, 3, 4]])
    accepted, token = verify_drafts(torch.tensor([[1, 2, 3]]), torch.tensor([3]), None, target,
                                    torch.zeros(1, 3), torch.tensor([0.9]))
    assert accepted.tolist() == [3] and token.tolist() == [4]


def test_all_rejected_never_returns_the_rejected_token_when_target_gives_it_zero():
    target = torch.tensor([[[0.0, 0.5, 0.5, 0.0, 0.0]] * 3])
    for u in torch.linspace(0, 0.999, 20):
        accepted, token = verify_drafts(torch.tensor([[0, 0]]), torch.tensor([2]), None, target,
                                        torch.full((1, 2), float(u)), u[None])
        assert accepted.tolist() == [0] and token.item() in (1, 2)


def test_padded_positions_past_num_drafts_are_never_accepted():
    target = _one_hot([[1, 1, 1], [2, 2, 2]])
    accepted, token = verify_drafts(torch.tensor([[1, 1], [2, 2]]), torch.tensor([1, 0]), None, target,
                                    torch.zeros(2, 2), torch.zeros(2))
    assert accepted.tolist() == [1, 0] and token.tolist() == [1, 2]


def test_empty_batch_gives_empty_results():
    accepted, token = verify_drafts(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, dtype=torch.long), None,
                                    torch.zeros(0, 4, V), torch.zeros(0, 3), torch.zeros(0))
    assert accepted.shape == (0,) and token.shape == (0,)


def test_residual_distribution_is_max_of_p_minus_q_normalised():
    p = torch.tensor([0.1, 0.6, 0.3, 0.0, 0.0])
    q = torch.tensor([0.7, 0.1, 0.2, 0.0, 0.0])
    n = 200_000
    g = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q, n, replacement=True, generator=g)[:, None]
    accepted, token = verify_drafts(drafts, torch.ones(n, dtype=torch.long), q.expand(n, 1, V).contiguous(),
                                    p.expand(n, 2, V).contiguous(), torch.rand(n, 1, generator=g),
                                    torch.rand(n, generator=g))
    first = torch.where(accepted == 1, drafts[:, 0], token)
    observed = torch.bincount(first, minlength=V).float() / n
    assert torch.allclose(observed, p, atol=0.005)


def test_sample_categorical_inverts_the_cdf_and_handles_unnormalised_weights():
    weights = torch.tensor([[0.0, 2.0, 0.0, 2.0]] * 3)
    assert sample_categorical(weights, torch.tensor([0.0, 0.49, 0.51])).tolist() == [1, 1, 3]
