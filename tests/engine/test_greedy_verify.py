"""Greedy verification (the argmax walk) agrees with verify_drafts on one-hot distributions."""
import torch

from engine.runtime.sampling import probs_from_logits
from engine.runtime.scheduler import Scheduled
from engine.runtime.sequence import Sequence
from engine.speculative.verify import verify_greedy
from governor_kernels import verify_drafts
from seam import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def test_greedy_verification_matches_rejection_sampling_on_one_hot_rows():
    generator = torch.Generator().manual_seed(0)
    vocab, k = 5, 4
    for trial in range(200):
        counts = torch.randint(0, k + 1, (3,), generator=generator).tolist()
        sampling = [Scheduled(Sequence(f"{trial}-{i}", [1], GREEDY), 1, c) for i, c in enumerate(counts)]
        logits = torch.randint(0, 3, (sum(counts) + len(counts), vocab), generator=generator).float()  # ties
        best = logits.argmax(dim=-1)
        starts, row = [], 0
        for item, count in zip(sampling, counts):
            # drafts that mostly agree with the target, so acceptance runs of every length occur
            drafts = [int(best[row + j]) if torch.rand(1, generator=generator) < 0.7 else
                      int(torch.randint(0, vocab, (1,), generator=generator)) for j in range(count)]
            item.proposed = drafts
            starts.append(row)
            row += count + 1

        verify_greedy(sampling, logits)
        got = ([item.accepted for item in sampling], [item.next_token for item in sampling])

        probs = probs_from_logits(logits, torch.zeros(len(logits)), torch.ones(len(logits)))
        rows = torch.tensor([[s + min(j, c) for j in range(k + 1)] for s, c in zip(starts, counts)])
        tokens = torch.tensor([item.proposed + [0] * (k - c) for item, c in zip(sampling, counts)])
        accepted, next_token = verify_drafts(tokens, torch.tensor(counts), None, probs[rows],
                                             torch.zeros(len(counts), k), torch.zeros(len(counts)))
        assert got == (accepted.tolist(), next_token.tolist())
