"""The Triton verification kernel, run by Triton's CPU interpreter, gives exactly the reference's results."""
import pytest
import torch

from governor_kernels.spec_verify import verify_drafts


def distributions(generator: torch.Generator, *shape: int) -> torch.Tensor:
    weights = torch.rand(*shape, generator=generator) ** 4      # peaked, like real next-token distributions
    return weights / weights.sum(dim=-1, keepdim=True)


def case(seed: int, batch: int, k: int, vocab: int, with_draft_probs: bool):
    g = torch.Generator().manual_seed(seed)
    draft_probs = distributions(g, batch, k, vocab)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    return (draft_tokens, torch.randint(0, k + 1, (batch,), generator=g), draft_probs if with_draft_probs else None,
            distributions(g, batch, k + 1, vocab), torch.rand(batch, k, generator=g), torch.rand(batch, generator=g))


def assert_same(triton_verify, *args):
    got, want = triton_verify(*args), verify_drafts(*args)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    return want


@pytest.mark.parametrize("with_draft_probs", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_batches_match_the_reference(triton_verify, seed, with_draft_probs):
    assert_same(triton_verify, *case(seed, batch=6, k=4, vocab=37, with_draft_probs=with_draft_probs))


def test_vocabulary_spanning_several_blocks_matches_the_reference(triton_verify):
    assert_same(triton_verify, *case(3, batch=3, k=3, vocab=2500, with_draft_probs=True))


def test_everything_rejected(triton_verify):
    drafts, num, q, p, u_accept, u_sample = case(4, batch=4, k=3, vocab=11, with_draft_probs=True)
    p = p.scatter(-1, torch.cat([drafts, drafts[:, :1]], dim=1)[..., None], 0.0)   # target never takes a draft
    p = p / p.sum(dim=-1, keepdim=True)
    accepted, token = assert_same(triton_verify, drafts, torch.full((4,), 3), q, p, u_accept, u_sample)
    assert accepted.tolist() == [0, 0, 0, 0] and (token != drafts[:, 0]).all()


def test_everything_accepted_samples_the_bonus_token(triton_verify):
    target = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), 9).float()
    drafts = torch.tensor([[1, 2, 3], [5, 6, 7]])
    accepted, token = assert_same(triton_verify, drafts, torch.tensor([3, 3]), None, target, torch.rand(2, 3),
                                  torch.rand(2))
    assert accepted.tolist() == [3, 3] and token.tolist() == [4, 8]


def test_residual_that_is_all_zero_falls_back_to_the_target(triton_verify):
    p = distributions(torch.Generator().manual_seed(5), 2, 2, 7)
    q = p[:, :1].clone()                                         # q == p: nothing left in max(0, p - q)
    drafts = q.argmax(dim=-1)
    assert_same(triton_verify, drafts, torch.tensor([1, 1]), q, p, torch.ones(2, 1) * 0.999, torch.tensor([0.3, 0.8]))


def test_no_drafts_samples_from_the_target(triton_verify):
    p = distributions(torch.Generator().manual_seed(6), 3, 1, 13)
    assert_same(triton_verify, torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, dtype=torch.long), None, p,
                torch.zeros(3, 0), torch.tensor([0.0, 0.5, 0.999]))


def test_empty_batch(triton_verify):
    accepted, token = triton_verify(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, dtype=torch.long), None,
                                    torch.zeros(0, 4, 5), torch.zeros(0, 3), torch.zeros(0))
    assert accepted.shape == (0,) and token.shape == (0,)


def test_uniform_on_a_cdf_step_takes_the_next_token_as_searchsorted_right_does(triton_verify):
    p = torch.tensor([[[0.25, 0.25, 0.25, 0.25]]] * 3)           # steps at 0.25, 0.5, 0.75: exact in binary
    _, token = assert_same(triton_verify, torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                           None, p, torch.zeros(3, 0), torch.tensor([0.0, 0.25, 0.5]))
    assert token.tolist() == [0, 1, 2]
