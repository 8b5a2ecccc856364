"""The switchback judge on synthetic per-block samples: each of its outcomes, early stopping, drift cancelling, and
its A/A error rate over many trials staying within 1 - confidence."""
import dataclasses
import json
import math

import numpy as np
import pytest
from scipy import stats

from controller.trials.judge import (BETTER, FUTILE, INCONCLUSIVE, MOVED_PAIRS, NO_DIFFERENCE, WORSE, SwitchbackJudge,
                                     compare, look_shares, min_pairs_for_interval, paired_log_ratios, same_tokens)
from engine.runtime.switchback import ORDER
from policies import JudgePolicy
from seam import Block, EngineConfig, strict_json

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


def agreeing_blocks(pairs: int, ratio: float, tied: bool = False) -> list[Block]:
    """pairs ABBA pairs in which every candidate block beats its incumbent by about ratio, no two by the same amount
    (the exact signed-rank test applies), or tied: two by two by the same amount (the test falls back to its normal
    approximation, whose smallest one-sided p from 8 pairs is 0.0057)."""
    out = []
    for index in range(2 * pairs):
        arm, pair = ORDER[index % 4], index // 2
        step = pair // 2 if tied else pair
        seconds = 0.2 / (ratio * (1 + 0.01 * step)) if arm == "candidate" else 0.2
        out.append(Block(index, arm, 1, 4, 20, seconds, 0.01, decode_tokens=20, decode_seconds=seconds))
    return out


@pytest.mark.parametrize("confidence, needed", [(0.95, 6), (0.99, 8), (0.995, 9), (0.999, 11)])
def test_the_minimum_for_an_interval_is_where_the_exact_test_first_rejects(confidence, needed):
    smallest_p = {n: stats.wilcoxon(np.arange(1.0, n + 1), alternative="greater", method="exact").pvalue
                  for n in (needed - 1, needed)}
    assert smallest_p[needed - 1] >= (1 - confidence) / 2 > smallest_p[needed]
    assert min_pairs_for_interval(confidence) == needed


@pytest.mark.parametrize("confidence", [0.95, 0.99])
@pytest.mark.parametrize("short", [1, 0])
def test_an_interval_needs_the_minimum_of_its_confidence_even_when_every_pair_agrees(confidence, short):
    pairs = min_pairs_for_interval(confidence) - short
    judge = SwitchbackJudge(JudgePolicy(confidence=confidence, min_samples=pairs, max_blocks=2 * pairs), 1.0)
    judge.add(agreeing_blocks(pairs, 1.5))
    verdict = judge.look()
    if short:
        assert verdict.outcome == INCONCLUSIVE and verdict.comparison is None
        assert "not enough evidence" in verdict.reason and verdict.evidence()["comparison"] is None
        assert f"needs {pairs + 1}" in verdict.reason
    else:
        assert verdict.outcome == BETTER and verdict.comparison.low > 1.0 and verdict.comparison.high < math.inf


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
    assert evidence["samples"]["sample"] == "decode_tokens_per_second"
    assert len(evidence["samples"]["incumbent"]) == len(evidence["samples"]["candidate"]) == evidence["pairs"]
    low, high = evidence["comparison"]["interval"]
    assert low <= evidence["comparison"]["effect"] <= high and 0 <= evidence["comparison"]["p_value"] < 0.01
    assert evidence["blocks"] >= 2 * evidence["pairs"] and evidence["outcome"] == WORSE


def test_aa_trials_rarely_claim_a_difference():
    # 120 A/A trials with sequential looks: the share ending better or worse stays within 1 - confidence (0.01),
    # with room for the binomial spread of 120 trials (at most 3 of them).
    rng = np.random.default_rng(9)
    outcomes = [run(1.0, 0.15, rng).outcome for _ in range(120)]
    assert sum(o in (BETTER, WORSE) for o in outcomes) <= 3


FUTILITY = SETTINGS.model_copy(update={"futility_confidence": 0.8})


def test_a_candidate_unlikely_to_clear_the_bar_stops_futile_at_an_early_look_and_keeps_the_incumbent():
    # 5 % slower under 20 % noise: not decisively worse at the first look, but clearly not clearing 1.0.
    plain = run(0.95, 0.2, np.random.default_rng(14))
    futile = run(0.95, 0.2, np.random.default_rng(14), settings=FUTILITY)
    assert plain.outcome != FUTILE and plain.look > 1
    assert futile.outcome == FUTILE and futile.look < futile.looks and futile.comparison.effect < 1.0
    assert "futile" in futile.reason


def test_the_futility_stop_never_keeps_a_candidate_and_rarely_stops_one_that_clears_the_bar():
    rng = np.random.default_rng(15)
    aa = [run(1.0, 0.15, rng, settings=FUTILITY).outcome for _ in range(120)]
    assert sum(o in (BETTER, WORSE) for o in aa) <= 3                  # the error rate of a verdict is untouched
    # 60 candidates at 1.15x, the same blocks judged with and without futility looks (one at 8 pairs, a look planned
    # out for efficacy): at most 3 stop futile, and at most 3 fewer are kept.
    faster = [run(1.15, 0.15, np.random.default_rng(seed), settings=FUTILITY).outcome for seed in range(60)]
    alone = [run(1.15, 0.15, np.random.default_rng(seed)).outcome for seed in range(60)]
    assert faster.count(FUTILE) <= 3 and faster.count(BETTER) >= alone.count(BETTER) - 3 >= 48


def test_an_untestable_sample_gives_no_comparison():
    assert compare(paired_log_ratios([1.0], [1.0])[0], 0.99) is None
    assert compare(paired_log_ratios([1.0, 2.0], [2.0, 4.0])[0], 0.99) is None   # every pair the same ratio
    with pytest.raises(ValueError):
        paired_log_ratios([1.0, 0.0], [1.0, 1.0])


def batched_blocks(ratio: float, count: int, rng, with_batch: bool = True) -> list[Block]:
    """ABBA blocks whose batch size wanders between 1 and 6 sequences, throughput growing as batch^0.8 (as decode
    throughput does on the 2-core machine), plus a log-normal noise of 0.05."""
    out = []
    for index in range(count):
        arm, batch = ORDER[index % 4], int(rng.integers(1, 7))
        rate = 40.0 * batch ** 0.8 * (ratio if arm == "candidate" else 1.0) * np.exp(rng.normal(0, 0.05))
        out.append(Block(index, arm, 1, 2, round(rate * 0.2), 0.2, 0.01, decode_tokens=round(rate * 0.2),
                         decode_seconds=0.2, decode_steps=2 if with_batch else 0,
                         decode_sequences=2 * batch if with_batch else 0))
    return out


def verdicts(blocks_: list[Block], settings=SETTINGS):
    judge, out = SwitchbackJudge(settings, 1.0), []
    for start in range(0, len(blocks_), 4):
        judge.add(blocks_[start:start + 4])
        verdict = judge.look()
        if verdict is not None:
            out.append(verdict)
            if verdict.decided:
                return out
    return out


@pytest.mark.parametrize("ratio", [1.0, 0.9])
def test_adjusting_for_batch_size_narrows_the_interval_around_the_true_ratio(ratio):
    data = batched_blocks(ratio, SETTINGS.max_blocks, np.random.default_rng(10))
    unadjusted = [Block(**{**b.__dict__, "decode_steps": 0, "decode_sequences": 0}) for b in data]
    adjusted, plain = verdicts(data)[-1], verdicts(unadjusted)[-1]
    assert 0.6 < adjusted.batch_slope < 1.0 and plain.batch_slope == 0.0
    assert adjusted.comparison.low <= ratio <= adjusted.comparison.high
    width = lambda verdict: math.log(verdict.comparison.high / verdict.comparison.low)  # noqa: E731
    assert adjusted.pairs <= plain.pairs and width(adjusted) < width(plain) / 4


def test_the_looks_spend_exactly_the_error_rate_and_the_later_looks_spend_more():
    looks = verdicts(blocks(1.0, 0.4, SETTINGS.max_blocks, np.random.default_rng(11)))
    spent = [1 - verdict.look_confidence for verdict in looks]
    assert looks[-1].outcome == INCONCLUSIVE and len(looks) == looks[-1].looks
    assert math.isclose(sum(spent), 1 - SETTINGS.confidence) and spent == sorted(spent)


def test_a_look_whose_pairs_cannot_reach_its_share_is_planned_out_and_spends_nothing():
    # 7 looks, every 10 pairs, at confidence 0.99: look 1's share in proportion (1/28 of 1 %: 0.018 % a side) is
    # below 2^-10, the smallest one-sided p of 10 pairs: it is planned out, and looks 2..7 share the whole 1 %.
    shares = look_shares(7, 10, 0.01)
    assert shares[0] == 0.0 and math.isclose(sum(shares), 0.01)
    assert all(2.0 ** -(10 * look) < share / 2 for look, share in enumerate(shares[1:], start=2))
    judge, rng = SwitchbackJudge(JudgePolicy(confidence=0.99, min_samples=10, max_blocks=140), 1.0), np.random.default_rng(13)
    judge.add(blocks(0.5, 0.01, 20, rng))
    first = judge.look()
    assert first.look == 1 and not first.decided and first.look_confidence == 1.0 and "planned out" in first.reason
    judge.add(blocks(0.5, 0.01, 20, rng, start=20))
    second = judge.look()
    assert second.look == 2 and second.outcome == WORSE and math.isclose(1 - second.look_confidence, shares[1])


def test_a_planned_out_look_still_stops_a_clear_loser_as_futile():
    # Look 1 (8 pairs) is planned out for efficacy at 0.99; a candidate at a tenth of the incumbent's speed (a drafter
    # tried blind) stops futile there, without spending any error rate, rather than running to look 2 at 16 pairs.
    settings = FUTILITY.model_copy(update={"max_blocks": 120})
    assert look_shares(settings.max_blocks // (2 * settings.min_samples), 8, 0.01)[0] == 0.0
    judge = SwitchbackJudge(settings, 1.0)
    judge.add(blocks(0.1, 0.2, 2 * settings.min_samples, np.random.default_rng(16)))
    verdict = judge.look()
    assert verdict.look == 1 and verdict.outcome == FUTILE and verdict.comparison.high < 1.0
    assert verdict.look_confidence == 1.0 and "futile" in verdict.reason
    judge = SwitchbackJudge(SETTINGS, 1.0)            # without futility_confidence, look 1 decides nothing
    judge.add(blocks(0.1, 0.2, 2 * SETTINGS.min_samples, np.random.default_rng(16)))
    assert not judge.look().decided


def gap_blocks(gaps: list[tuple[float, float]]) -> list[Block]:
    """One pair per (incumbent gap, candidate gap), in ABBA order: blocks whose tokens came at those mean gaps."""
    out = []
    for pair, gap_by_arm in enumerate(gaps):
        for index in (2 * pair, 2 * pair + 1):
            arm = ORDER[index % 4]
            gap = gap_by_arm[arm == "candidate"]
            out.append(Block(index, arm, 1, 2, 10, 0.2, gap, decode_tokens=10, decode_seconds=0.2))
    return out


def test_a_candidate_that_delivers_tokens_slower_in_most_pairs_is_slower():
    rng = np.random.default_rng(12)
    judge = SwitchbackJudge(SETTINGS, 1.0)
    judge.add(gap_blocks([(0.05 * rng.uniform(0.8, 1.2), 0.15 * rng.uniform(0.8, 1.2)) for _ in range(8)]))
    p_value, pairs = judge.slower_tokens()
    assert pairs == 8 and p_value < 1 - SETTINGS.confidence


def test_stalls_that_land_in_the_candidates_blocks_by_chance_are_not_slower():
    # Same config on both arms; a stall (a 1 s gap) in two of the candidate's blocks and one of the incumbent's: the
    # candidate's blocks break any SLO below 1 s, but they are not slower pair by pair.
    rng = np.random.default_rng(13)
    gaps = [(0.05 * rng.uniform(0.8, 1.2), 0.05 * rng.uniform(0.8, 1.2)) for _ in range(12)]
    gaps[3], gaps[7], gaps[9] = (0.05, 1.0), (0.05, 1.0), (1.0, 0.05)
    judge = SwitchbackJudge(SETTINGS, 1.0)
    judge.add(gap_blocks(gaps))
    p_value, pairs = judge.slower_tokens()
    assert pairs == 12 and p_value > 0.05


def test_too_few_pairs_are_never_slower():
    judge = SwitchbackJudge(SETTINGS, 1.0)
    judge.add(gap_blocks([(0.05, 1.0)]))
    assert judge.slower_tokens() == (1.0, 1)


def accepting_blocks(cost_ratio: float, count: int, rng) -> list[Block]:
    """Blocks of 2 steps at batch 2 (light load) whose drafts are accepted by chance (1 to 5 tokens per
    sequence-step, the same distribution on both arms), the candidate's steps cost_ratio x as long, with a little
    timing noise."""
    out = []
    for index in range(count):
        arm = ORDER[index % 4]
        seconds = 0.1 * (cost_ratio if arm == "candidate" else 1.0) * np.exp(rng.normal(0, 0.05))
        tokens = int(rng.integers(1, 6, size=4).sum())
        out.append(Block(index, arm, 1, 2, tokens, seconds, seconds / tokens, decode_tokens=tokens,
                         decode_seconds=seconds, decode_steps=2, decode_sequences=4))
    return out


def test_arms_that_deliver_the_same_tokens_are_compared_without_acceptance_noise():
    # A candidate 10 % slower per step with the same drafts: tokens per second carries the acceptance noise and is not
    # decisive over 40 pairs; sequences stepped per second is, and points at the true ratio.
    data = accepting_blocks(1 / 0.9, 80, np.random.default_rng(14))
    settings = JudgePolicy(confidence=0.99, min_samples=40, max_blocks=80, margin=0.03)
    tokens, steps = SwitchbackJudge(settings, 1.0), SwitchbackJudge(settings, 1.0, same_tokens=True)
    tokens.add(data)
    steps.add(data)
    by_tokens, by_steps = tokens.look(), steps.look()
    assert by_steps.outcome == WORSE and 0.85 < by_steps.comparison.effect < 0.95
    assert by_tokens.outcome == INCONCLUSIVE
    assert by_steps.samples["sample"] == "decode_sequence_steps_per_second"


def test_same_tokens_means_the_same_drafting_and_capacity():
    config = EngineConfig(spec_method="ngram", draft_len=4, capacity_factor=1.5)
    assert same_tokens(config, config.changed(version=7, placement=((1, 0),)))
    assert same_tokens(config.changed(spec_method="off"), config.changed(spec_method="off", draft_len=2))
    assert not same_tokens(config, config.changed(draft_len=5))
    assert not same_tokens(config, config.changed(draft_len_schedule=((1, 4), (2, 2))))
    assert not same_tokens(config, config.changed(spec_method="draft_model"))
    assert not same_tokens(config, config.changed(capacity_factor=2.0))


def test_pairs_at_batch_sizes_where_the_two_configs_step_alike_are_left_out():
    incumbent = EngineConfig(spec_method="ngram", draft_len=4)
    candidate = incumbent.changed(draft_len_schedule=((11, 4), (22, 0), (1024, 4)))   # plain decoding at 12-22
    judge = SwitchbackJudge(SETTINGS, 1.0, configs=(incumbent, candidate))

    def at(batch: int, start: int, ratio: float) -> list[Block]:
        return [dataclasses.replace(block, decode_steps=1, decode_sequences=batch)
                for block in blocks(ratio, 0.02, 4, np.random.default_rng(start), start=start)]
    judge.add(at(1, 0, 1.0) + at(1, 4, 1.0))                  # 1 sequence: the same k 4 under both
    assert judge.pairs() == []
    judge.add(at(16, 8, 1.5) + at(16, 12, 1.5))
    assert len(judge.pairs()) == 4 and all(i.decode_batch_size == 16 for i, _ in judge.pairs())
    unaware = SwitchbackJudge(SETTINGS, 1.0)
    unaware.add(at(1, 0, 1.0) + at(16, 8, 1.5))
    assert len(unaware.pairs()) == 4


def test_a_trial_whose_load_left_the_batch_sizes_it_changes_ends_at_once():
    incumbent = EngineConfig(spec_method="ngram", draft_len=4)
    candidate = incumbent.changed(draft_len_schedule=((11, 4), (22, 0), (1024, 4)))
    judge = SwitchbackJudge(SETTINGS, 1.0, configs=(incumbent, candidate))

    def at(batch: int, start: int, prefilling: bool = False) -> list[Block]:
        decode = dict(decode_steps=0, decode_sequences=0, decode_tokens=0, decode_seconds=0.0) if prefilling else \
            dict(decode_steps=1, decode_sequences=batch)
        return [dataclasses.replace(block, sequences=batch * block.steps, **decode)
                for block in blocks(1.2, 0.3, 4, np.random.default_rng(start), start=start)]
    judge.add(at(16, 0) + at(16, 4))                                      # 4 pairs at 16 sequences, then ...
    starts = iter(range(8, 1000, 4))
    for pair in range(MOVED_PAIRS // 2 - 1):                              # ... MOVED_PAIRS - 2 pairs at 1, half of
        judge.add(at(1, next(starts), prefilling=pair % 2 == 1))          # them with a prefill in every step ...
        assert judge.look() is None and not judge.load_moved()
    judge.add(at(1, next(starts), prefilling=True))                       # ... and 2 more: the load has moved
    verdict = judge.look()
    assert judge.load_moved() and verdict.outcome == INCONCLUSIVE and verdict.blocks < SETTINGS.max_blocks
    assert "step alike" in verdict.reason and verdict.pairs == 4


def test_a_bound_the_test_cannot_place_is_null_with_its_note_and_the_evidence_is_strict_json():
    """8 tied block pairs at 99 %: enough for an interval by the exact test, but ties send it to the normal
    approximation, whose smallest one-sided p (0.0057) is above 0.005, so it rejects no ratio on either side and the
    interval is (0, inf); it is recorded as unknown, never as Infinity."""
    judge = SwitchbackJudge(JudgePolicy(confidence=0.99, min_samples=8, max_blocks=16, margin=0.03), 1.0)
    judge.add(agreeing_blocks(8, 1.5, tied=True))
    judgment = judge.look()
    assert judgment.pairs == 8 and (judgment.comparison.low, judgment.comparison.high) == (0.0, math.inf)
    comparison = judgment.evidence()["comparison"]
    assert comparison["interval"] == [None, None]
    assert "lower and upper bound unknown" in comparison["interval_note"] and "8 block pairs" in comparison["interval_note"]
    assert "interval [unknown, unknown]" in judgment.reason and "inf" not in judgment.reason
    json.loads(strict_json.dumps(judgment.evidence()), parse_constant=_no_constant)


def _no_constant(name: str):
    raise AssertionError(f"{name} is not JSON")
