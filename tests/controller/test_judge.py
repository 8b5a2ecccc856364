"""The switchback judge on synthetic per-block samples: each of its outcomes, early stopping, drift cancelling, and
its A/A error rate over many trials staying within 1 - confidence."""
import numpy as np
from controller.judge import BETTER, INCONCLUSIVE, NO_DIFFERENCE, WORSE, SwitchbackJudge, compare
from engine.switchback import ORDER
from policies import JudgePolicy
from seam import Block

SETTINGS = JudgePolicy(confidence=0.99, min_samples=8, max_blocks=96, margin=0.03)


def blocks(ratio: float, noise: float, count: int, rng, trend: float = 0.0, start: int = 0) -> list[Block]:
    """count blocks in ABBA order; the candidate's decode throughput is ratio x the incumbent's, both times
    a multiplicative log-normal noise and a traffic trend (1 + trend x block index)."""
    out = []
    for index in range(start, start + count):
        arm = ORDER[index % 4]
        rate = 100.0 * (1 + trend * index) * (ratio if arm == "candidate" else 1.0) * np.exp(rng.normal(0, noise))
        out.append(Block(index, arm, 1, 4, round(rate * 0.2), 0.2, 0.01, decode_tokens=round(rate * 0.2),
                         decode_seconds=0.2))
    return out


def run(ratio: float, noise: float, rng, keep_gain: float = 1.0, trend: float = 0.0, settings=SETTINGS):
    """Feed blocks a few at a time until the judge decides; the deciding verdict."""
    judge, index = SwitchbackJudge(settings, keep_gain), 0
    while True:
        judge.add(blocks(ratio, noise, 4, rng, trend, start=index))
        index += 4
        verdict = judge.look()
        if verdict is not None and verdict.decided:
            return verdict


def test_a_faster_candidate_is_better_before_max_blocks():
    verdict = run(1.25, 0.1, np.random.default_rng(1))
    assert verdict.outcome == BETTER and verdict.comparison.low >= 1.0 and verdict.blocks < SETTINGS.max_blocks


def test_a_slower_candidate_is_worse():
    verdict = run(0.9, 0.05, np.random.default_rng(2))
    assert verdict.outcome == WORSE and verdict.comparison.high <= 1.0 + 1e-9
    assert 0.85 < verdict.comparison.effect < 0.95


def test_a_faster_candidate_that_misses_keep_gain_is_worse():
    verdict = run(1.05, 0.03, np.random.default_rng(3), keep_gain=1.10)
    assert verdict.outcome == WORSE and verdict.comparison.high <= 1.10 + 1e-9   # the interval is found by bisection


def test_identical_arms_with_little_noise_are_no_difference():
    verdict = run(1.0, 0.02, np.random.default_rng(4))
    assert verdict.outcome == NO_DIFFERENCE and 1 / 1.03 <= verdict.comparison.low <= verdict.comparison.high <= 1.03


def test_identical_arms_under_heavy_noise_end_inconclusive_at_max_blocks():
    verdict = run(1.0, 0.4, np.random.default_rng(5))
    assert verdict.outcome == INCONCLUSIVE and verdict.blocks >= SETTINGS.max_blocks and verdict.look == verdict.looks


def test_a_trend_in_the_traffic_cancels_out():
    # Throughput grows 4x over the trial; adjacent ABBA blocks still compare like with like.
    verdict = run(1.0, 0.02, np.random.default_rng(6), trend=0.03)
    assert verdict.outcome == NO_DIFFERENCE


def test_no_verdict_between_looks():
    judge = SwitchbackJudge(SETTINGS, 1.0)
    judge.add(blocks(1.0, 0.1, 2 * SETTINGS.min_samples - 2, np.random.default_rng(7)))
    assert judge.look() is None


def test_evidence_records_samples_effect_interval_p_value_and_blocks():
    evidence = run(0.8, 0.05, np.random.default_rng(8)).evidence()
    assert len(evidence["samples"]["incumbent_decode_tokens_per_second"]) == evidence["pairs"]
    assert len(evidence["samples"]["candidate_decode_tokens_per_second"]) == evidence["pairs"]
    low, high = evidence["comparison"]["interval"]
    assert low <= evidence["comparison"]["effect"] <= high and 0 <= evidence["comparison"]["p_value"] < 0.01
    assert evidence["blocks"] >= 2 * evidence["pairs"] and evidence["outcome"] == WORSE


def test_aa_trials_rarely_claim_a_difference():
    # 120 A/A trials with sequential looks: the share ending better or worse stays within 1 - confidence (0.01),
    # with room for the binomial spread of 120 trials (at most 3 of them).
    rng = np.random.default_rng(9)
    outcomes = [run(1.0, 0.15, rng).outcome for _ in range(120)]
    assert sum(o in (BETTER, WORSE) for o in outcomes) <= 3


def test_an_untestable_sample_gives_no_comparison():
    assert compare([1.0], [1.0], 0.99) is None
    assert compare([1.0, 2.0], [2.0, 4.0], 0.99) is None          # every pair the same ratio: no spread to test
    assert compare([1.0, 0.0], [1.0, 1.0], 0.99) is None
