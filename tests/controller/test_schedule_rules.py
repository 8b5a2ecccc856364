"""The controller learns k per batch band and the drafter, on calibrated predictions: schedule arithmetic, the
calibration's correction of an optimistic model, and the rules' proposals from the engine's own Window type."""

import dataclasses
import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controller.counters import PrometheusCounters
from controller.decide.calibration import MEMORY, PRIOR_SHRINK, PRIOR_TRIALS, Calibration
from controller.decide.rule_policy import RulePolicy
from controller.decide.schedule import band_batch_sizes, learned, with_bands
from controller.strategy import UNMEASURED
from policies import parse_policy
from seam import EngineConfig, LatencySummary, Window
from tests.controller.windows import decoding

EMPTY = LatencySummary.of([])
QUIET = parse_policy({"speculation": {"reprobe_windows": 1000}})


def _quiet(calibration: Calibration | None = None) -> RulePolicy:
    """Rules whose probes, of the other mode and of the other drafter, wait 1000 windows from window 0."""
    rules = RulePolicy(QUIET, calibration=calibration)
    rules.state.last_drafter_probe = 0
    return rules


def test_bands_tile_the_batch_sizes():
    edges = [band_batch_sizes(band) for band in range(8)]
    assert edges[0] == (1, 1) and edges[1] == (2, 2) and edges[2] == (3, 5)
    assert all(high + 1 == low for (_, high), (low, _) in zip(edges, edges[1:]))


def test_a_band_changes_only_its_batch_sizes_and_one_k_everywhere_is_draft_len():
    banded = with_bands(EngineConfig(draft_len=4), {2: 6})
    assert banded.draft_len_schedule == ((2, 4), (5, 6), (6, 4))
    assert [banded.draft_len_for(b) for b in (1, 2, 3, 5, 6, 100)] == [4, 4, 6, 6, 4, 4]
    assert with_bands(banded, {2: 4}) == EngineConfig(draft_len=4)


def test_learning_a_band_keeps_the_bands_already_learned_and_the_others_within_their_neighbours():
    config = EngineConfig(draft_len=4)
    assert learned(config, 0, 2, measured_bands={0}) == EngineConfig(draft_len=2)   # larger batches: at most k 2
    first = learned(config, 0, 8, measured_bands={0})                 # only batch 1 measured: the others keep k 4
    assert [first.draft_len_for(b) for b in (1, 2, 5000)] == [8, 4, 4]
    first = EngineConfig(draft_len=8)
    second = learned(first, 4, 2, measured_bands={0, 4})              # batch ~16 measured next
    # batch 2-11 keep k 8 (within 8 below and 2 above); beyond the largest learned band: at most its k
    assert [second.draft_len_for(b) for b in (1, 2, 3, 11, 12, 22, 23, 5000)] == [8, 8, 8, 8, 2, 2, 2, 2]
    third = learned(second, 2, 5, measured_bands={0, 2, 4})
    # batch 2 within 8 and 5 keeps 8; batch 6-11, between 5 and 2, drafts at most 5
    assert [third.draft_len_for(b) for b in (1, 2, 3, 5, 6, 11, 12, 22, 5000)] == [8, 8, 5, 5, 5, 5, 2, 2, 2]


def test_calibration_learns_a_shrink_of_the_predicted_gain_that_holds_for_smaller_predictions():
    calibration = Calibration()
    for _ in range(10):                                 # 1.4x predicted, measured half the log gain: 1.4 ** 0.5
        calibration.record("draft_len", 1.4, calibration.corrected("draft_len", 1.4), measured=1.4 ** 0.5)
    calibration.record("draft_len", 1.01, 1.01, measured=0.5)    # a gain of almost nothing says nothing of the shrink
    beta = (PRIOR_TRIALS * PRIOR_SHRINK + 10 * 0.5) / (PRIOR_TRIALS + 10)
    assert beta == pytest.approx(0.583, abs=1e-3)
    assert calibration.corrected("draft_len", 1.1) == pytest.approx(1.1 ** beta)      # above 1: not over-corrected


def test_calibration_learns_each_batch_bands_bias_apart():
    calibration = Calibration()
    for _ in range(6):       # k trials at 1 sequence under-predicted, at 16 sequences over-predicted
        calibration.record("draft_len", 1.2, 1.2, measured=1.2 ** 2, band=0)
        calibration.record("draft_len", 1.25, 1.25, measured=1.25 ** -1, band=4)
    light, heavy, anywhere = (calibration.corrected("draft_len", 1.2, band) for band in (0, 4, None))
    assert 1.0 < heavy < 1.05 < anywhere < light and light > 1.2
    kind_beta = (PRIOR_TRIALS * PRIOR_SHRINK + 12 * 1.0) / (PRIOR_TRIALS + 12)   # median of six 2s and six 0s
    assert anywhere == pytest.approx(1.2 ** kind_beta)
    assert light == pytest.approx(1.2 ** ((PRIOR_TRIALS * PRIOR_SHRINK + 6 * 2.0) / (PRIOR_TRIALS + 6)))
    # measured on the other side of 1: the prediction said nothing (shrink 0), and is not reversed
    assert heavy == pytest.approx(1.2 ** ((PRIOR_TRIALS * PRIOR_SHRINK + 6 * 0.0) / (PRIOR_TRIALS + 6)))
    # no trial at 3-5 sequences: the prior's, not the other bands' (which lean opposite ways)
    assert calibration.corrected("draft_len", 1.2, band=2) == pytest.approx(1.2 ** PRIOR_SHRINK)


def test_a_probe_of_the_other_mode_calibrates_the_k_changes_at_its_band():
    calibration = Calibration()
    calibration.record("fallback_probe", 1 / 1.5, 1 / 1.5, measured=1 / 1.2, band=4)   # plain: 0.67x k predicted, 0.83x
    beta = (PRIOR_TRIALS * PRIOR_SHRINK + math.log(1.2) / math.log(1.5)) / (PRIOR_TRIALS + 1)
    assert calibration.corrected("draft_len", 1.5, band=4) == pytest.approx(1.5 ** beta)    # k's gain shrinks there
    assert calibration.corrected("draft_len", 1.1, band=0) == pytest.approx(1.1)     # other bands: the prior
    assert calibration.corrected("spec_method", 1.1, band=4) == pytest.approx(1.1)   # another what-if


def test_calibration_learns_the_models_bias_and_reports_it():
    calibration = Calibration()
    assert calibration.corrected("draft_len", 1.2) == pytest.approx(1.2 ** PRIOR_SHRINK)   # the prior alone
    for _ in range(10):
        raw = 1.2
        calibration.record("draft_len", raw, calibration.corrected("draft_len", raw), measured=0.9)
    assert 1.0 < calibration.corrected("draft_len", 1.2) < 1.05      # measured 0.9 for 1.2 predicted, 10 times
    assert calibration.corrected("spec_method", 1.2) == pytest.approx(1.2 ** PRIOR_SHRINK)   # another kind: prior only
    summary = calibration.summary()
    assert summary["trials"] == 10 and summary["raw_over_predicted_share"] == 1.0
    assert summary["raw_median_abs_error"] == pytest.approx(0.25)
    assert summary["median_abs_error"] < summary["raw_median_abs_error"]
    registry = CollectorRegistry()
    PrometheusCounters(registry, "m").calibration(summary)
    scrape = generate_latest(registry).decode()
    assert 'governor_controller_calibration{figure="raw_over_predicted_share",model="m"} 1.0' in scrape
    assert 'governor_controller_calibration{figure="trials",model="m"} 10.0' in scrape


def _window(method: str, k: int, batch: float, seconds_per_step: float, accepted: float) -> Window:
    """A window of 100 steps at k; a step costs seconds_per_step at k = 0, and 15% more per draft position and
    sequence past the first (verification grows with the batch)."""
    steps = 100
    seconds_per_step *= 1 + 0.15 * k * batch
    drafted = [steps * round(batch)] * k
    kept = [round(d * accepted ** (j + 1)) for j, d in enumerate(drafted)]
    return decoding(Window(
        start=0.0, end=1.0, config_version=1, spec_method=method, draft_len=k, steps=steps, num_drafts=sum(drafted[:1]),
        drafted_tokens=sum(drafted), accepted_tokens=sum(kept), drafted_per_position=drafted,
        accepted_per_position=kept, emitted_tokens=round(steps * batch * (1 + sum(kept) / max(sum(drafted[:1]), 1))),
        prefill_tokens=0, finished_requests=5, target_forward_seconds=steps * seconds_per_step * 0.8,
        draft_forward_seconds=steps * seconds_per_step * 0.1 * (k > 0), step_seconds=steps * seconds_per_step,
        ttft_seconds=EMPTY, inter_token_seconds=EMPTY, e2e_seconds=EMPTY, batch_size_mean=batch,
        batch_size_max=round(batch), queue_depth_mean=0.0, queue_depth_max=0, expert_tokens=None))


def test_a_k_change_the_calibrated_model_no_longer_believes_is_not_proposed():
    current = EngineConfig(spec_method="draft_model", draft_len=2)
    optimistic = _quiet()
    for k in (2, 4):
        optimistic.observe(_window("draft_model", k, batch=1, seconds_per_step=0.01, accepted=0.9))
    proposal = optimistic.propose(current, _window("draft_model", 2, 1, 0.01, 0.9), 1)
    assert proposal.kind == "draft_len" and proposal.config.draft_len_for(1) > 2
    assert 1.0 < proposal.predicted_gain == proposal.raw_gain          # no trial yet: the model at its word

    burned = Calibration()
    for _ in range(MEMORY):                     # every trial measured a loss: the prediction, shrunk, falls below 1.05
        burned.record("draft_len", proposal.raw_gain, proposal.predicted_gain, measured=0.95,
                      band=proposal.inputs["band"])
    humbled = _quiet(calibration=burned)
    for k in (2, 4):
        humbled.observe(_window("draft_model", k, batch=1, seconds_per_step=0.01, accepted=0.9))
    assert humbled.propose(current, _window("draft_model", 2, 1, 0.01, 0.9), 1) is None


def test_the_drafter_that_wins_is_proposed_and_one_never_measured_is_tried():
    current = EngineConfig(spec_method="draft_model", draft_len=4)
    policy = parse_policy({"speculation": {"reprobe_windows": 3, "k_max": 4}})
    rules = RulePolicy(policy)
    rules.state.last_mode_probe = 10**6                                  # no on/off probe in this test
    rules.observe(_window("draft_model", 4, batch=1, seconds_per_step=0.02, accepted=0.9))
    tried = rules.propose(current, _window("draft_model", 4, 1, 0.02, 0.9), 3)
    assert tried.kind == "spec_method" and tried.config.spec_method == "ngram" and tried.predicted_gain is None
    # prompt lookup measured: drafts cost nothing and it accepts as well, so its model predicts a gain
    rules.observe(_window("ngram", 4, batch=1, seconds_per_step=0.012, accepted=0.9))
    switch = rules.propose(current, _window("draft_model", 4, 1, 0.02, 0.9), 4)
    assert switch.kind == "spec_method" and switch.config.spec_method == "ngram"
    assert switch.predicted_gain >= policy.trial.min_predicted_gain and "calibrated" in switch.reason
    rules.finished(switch, "failed", None, 4)                            # e.g. an engine without that drafter
    assert "ngram" in rules.state.unavailable


def test_a_drafter_never_measured_is_tried_under_light_load_only():
    policy = parse_policy({"speculation": {"reprobe_windows": 1}})
    rules = RulePolicy(policy)
    rules.state.last_mode_probe = 10**6
    current = EngineConfig(spec_method="ngram", draft_len=4)
    for k in (2, 4):
        rules.observe(_window("ngram", k, batch=16, seconds_per_step=0.05, accepted=0.3))
    heavy = rules.propose(current, _window("ngram", 4, 16, 0.05, 0.3), 5)
    assert heavy is None or heavy.kind != "spec_method"
    light = rules.propose(current, _window("ngram", 4, 2, 0.01, 0.3), 6)
    assert light.kind == "spec_method" and light.config.spec_method == "draft_model" and "batch band 1" in light.reason


def test_a_drafter_never_measured_is_tried_at_the_first_light_window_before_k_is_tuned_there():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 3, "k_max": 8}}))
    current = EngineConfig(spec_method="ngram", draft_len=4)
    copying = _window("ngram", 4, batch=1, seconds_per_step=0.01, accepted=0.95)
    rules.observe(copying)
    tried = rules.propose(current, copying, 1)
    assert tried.kind == "spec_method" and tried.config.spec_method == "draft_model"
    rules.finished(tried, "reverted", None, 1)
    rules.observe(_window("draft_model", 4, batch=1, seconds_per_step=0.05, accepted=0.5))   # its arm, measured
    assert rules.propose(current, copying, 2).kind == "draft_len"          # k for prompt lookup next
    code = _window("ngram", 4, batch=2, seconds_per_step=0.012, accepted=0.6)
    rules.observe(code)
    assert rules.propose(current, code, 9).kind != "spec_method"           # not tried again at the next light band


def test_a_k_not_measured_waits_for_the_bands_price_or_for_the_decode_steps_one_is_fitted_on():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1000, "k_max": 8}}))
    rules.state.unavailable.add("draft_model")
    current = EngineConfig(spec_method="ngram", draft_len=4)
    copying = _window("ngram", 4, batch=1, seconds_per_step=0.01, accepted=0.95)
    starting = dataclasses.replace(copying, decode_cost_sums=[x / 10 for x in copying.decode_cost_sums])
    rules.observe(starting)                                  # 10 decode steps at k 4: k 8's cost is unknown
    assert rules.state.models["ngram"].price_per_draft_token(0) is None
    assert rules.propose(current, starting, 1) is None
    rules.observe(copying)                     # 110: every step drafted alike, so no price will come; k 8 is tried
    proposal = rules.propose(current, copying, 2)
    assert proposal.kind == "draft_len" and proposal.config.draft_len_for(1) > 4


def test_a_drafter_tried_blind_is_not_tried_blind_again_even_if_its_model_is_still_unready_until_a_pin_ends():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1000}, "trial": {"retry_windows": 1}}))
    rules.state.last_mode_probe = 10**6
    current = EngineConfig(spec_method="ngram", draft_len=4)
    copying = _window("ngram", 4, batch=1, seconds_per_step=0.01, accepted=0.95)
    rules.observe(copying)
    tried = rules.propose(current, copying, 1)
    assert tried.kind == "spec_method" and tried.raw_gain is None
    rules.finished(tried, UNMEASURED, None, 1)                     # the load left first: it may be tried again
    rules.state.last_drafter_probe = -1000
    assert rules.propose(current, copying, 2).kind == "spec_method"
    rules.finished(tried, "futile", None, 2)                       # measured losing; its model not ready (no window)
    rules.state.last_drafter_probe = -1000
    assert not rules.state.models["draft_model"].ready(0)
    assert all(p is None or p.kind != "spec_method" for p in (rules.propose(current, copying, i) for i in (3, 50)))
    rules.released(current)
    rules.state.last_mode_probe = 10**6
    assert rules.propose(current, copying, 51).kind == "spec_method"


def test_k_for_the_band_the_load_is_in_leaves_the_learned_band_alone():
    rules = _quiet()
    for k in (2, 4):
        rules.observe(_window("draft_model", k, batch=1, seconds_per_step=0.01, accepted=0.9))
        rules.observe(_window("draft_model", k, batch=16, seconds_per_step=0.05, accepted=0.3))
    current = EngineConfig(draft_len=6)                                # batch 1 learned k 6; batch 16 runs it too
    proposal = rules.propose(current, _window("draft_model", 6, 16, 0.05, 0.3), 1)
    assert proposal.kind == "draft_len" and "batch band 4" in proposal.reason
    assert proposal.config.draft_len_for(1) == 6 and proposal.config.draft_len_for(16) < 6


def test_a_speculation_probe_after_a_pin_restores_the_schedule_speculation_last_ran_with():
    rules = _quiet()
    speculative = EngineConfig(spec_method="draft_model", draft_len_schedule=((1, 6), (1024, 3)))
    assert rules.propose(speculative, _window("draft_model", 6, 1, 0.01, 0.9), 1) is None
    plain = EngineConfig(spec_method="off", draft_len=0)      # an operator's pin turned speculation off
    rules.released(plain)
    probe = rules.propose(plain, _window("draft_model", 1, 1, 0.01, 0.9), 2)
    assert probe.kind == "speculation_probe"
    assert probe.config.spec_method == "draft_model" and probe.config.draft_len_bands == speculative.draft_len_bands


def test_a_band_where_plain_decoding_measured_faster_gets_k_0_and_the_other_bands_keep_speculating():
    rules = _quiet()
    for k in (2, 4):
        rules.observe(_window("ngram", k, batch=1, seconds_per_step=0.01, accepted=0.9))
        rules.observe(_window("ngram", k, batch=16, seconds_per_step=0.05, accepted=0.1))
    current = EngineConfig(spec_method="ngram", draft_len=4)
    assert rules.propose(current, _window("ngram", 4, 16, 0.05, 0.1), 1).config.draft_len_for(16) > 0   # not measured
    rules.observe(_window("off", 0, batch=16, seconds_per_step=0.05, accepted=0.0))    # e.g. a fallback probe's arm
    proposal = rules.propose(current, _window("ngram", 4, 16, 0.05, 0.1), 2)
    assert proposal.kind == "draft_len" and proposal.predicted_gain > 1.05
    assert proposal.config.draft_len_for(16) == 0 and proposal.config.draft_len_for(1) == 4
    # batch 2-11, between k 4 and k 0, keep k 4; larger batches than the band learned draft no more than it
    assert proposal.config.longest_draft_len == 4 and "<=11: 4, more: 0" in proposal.reason


def test_a_band_decoding_plainly_is_left_to_the_probes_of_speculation():
    rules = _quiet()
    for k in (0, 2, 4):
        rules.observe(_window("ngram" if k else "off", k, batch=1, seconds_per_step=0.01, accepted=0.9))
    speculating = EngineConfig(spec_method="ngram", draft_len=2)
    assert rules.propose(speculating, _window("ngram", 2, 1, 0.01, 0.9), 1).config.draft_len_for(1) > 2
    plain_here = EngineConfig(spec_method="ngram", draft_len_schedule=((1, 0), (1024, 4)))
    assert rules.propose(plain_here, _window("ngram", 0, 1, 0.01, 0.0), 1) is None   # no k trial: a probe's to ask


def test_probes_of_plain_decoding_that_keep_losing_back_off_at_their_batch_band():
    policy = parse_policy({"speculation": {"reprobe_windows": 2, "reprobe_backoff_max": 4},
                           "trial": {"retry_windows": 1}})             # only the backoff spaces the probes
    rules = RulePolicy(policy)
    rules.state.unavailable.add("ngram")                                 # no drafter trials in this test
    current = EngineConfig(spec_method="draft_model", draft_len=4)
    light = _window("draft_model", 4, batch=1, seconds_per_step=0.01, accepted=0.9)

    def probes(windows: range, baseline: Window = light) -> list[int]:
        found = []
        for index in windows:
            proposal = rules.propose(current, baseline, index)
            if proposal is not None:
                assert proposal.kind == "fallback_probe"
                rules.finished(proposal, "reverted", None, index)      # plain decoding lost again
                found.append(index)
        return found

    assert probes(range(1, 40)) == [2, 6, 14, 22, 30, 38]       # waits 4, 8, 8: at most 4 x reprobe_windows
    assert probes(range(40, 46), _window("draft_model", 4, 4, 0.01, 0.9)) == [40, 44]   # batch 4: from 2 again
    assert probes(range(46, 60)) == [52]                        # back at batch 1: its backoff held (8 after 44)
    rules.released(current)
    assert rules.reprobe_wait(speculating=True, band=0) == 2
    probe = rules.propose(current, light, 60)
    rules.finished(probe, "unmeasured", None, 60)                   # the load left before it measured anything:
    assert rules.reprobe_wait(speculating=True, band=0) == 2        # no loss, no longer wait
    rules.finished(probe, "inconclusive", None, 61, measured_gain=1.0)   # undecided, plain decoding past its bar
    assert rules.reprobe_wait(speculating=True, band=0) == 2             # (1 / min_gain): measured ahead, no loss
    rules.finished(probe, "inconclusive", None, 62, measured_gain=0.9)   # undecided and behind it: a loss
    assert rules.reprobe_wait(speculating=True, band=0) == 4
    rules.finished(probe, "reverted", None, 63)
    assert rules.reprobe_wait(speculating=True, band=0) == 8
    assert rules.reprobe_wait(speculating=False, band=0) == 2       # probes of speculation keep their own count
    rules.state.probes_lost["speculation_probe"][0] = 5
    assert rules.reprobe_wait(speculating=False, band=0) == 8


def test_a_bad_backoff_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="reprobe_backoff_max"):
        parse_policy({"speculation": {"reprobe_backoff_max": 0}})


def test_a_probe_of_plain_decoding_covers_the_band_the_load_is_in_and_speculation_returns_there_alone():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1}}))
    rules.state.unavailable.add("draft_model")                           # no drafter trials in this test
    current = EngineConfig(spec_method="ngram", draft_len_schedule=((1, 8), (1024, 4)))
    heavy = _window("ngram", 4, batch=16, seconds_per_step=0.05, accepted=0.1)
    probe = rules.propose(current, heavy, 1)
    assert probe.kind == "fallback_probe" and "batch band 4" in probe.reason
    fallen = probe.config          # kept: plain decoding at 12-22 sequences and the larger ones never measured
    assert [fallen.draft_len_for(b) for b in (1, 2, 11, 12, 22, 23, 5000)] == [8, 4, 4, 0, 0, 0, 0]
    rules.finished(probe, "kept", None, 1)
    light = rules.propose(fallen, _window("ngram", 8, batch=1, seconds_per_step=0.01, accepted=0.9), 2)
    assert light.kind == "fallback_probe" and light.config.draft_len_for(1) == 0   # batch 1 speculates: probed
    plain = _window("ngram", 0, batch=16, seconds_per_step=0.05, accepted=0.0)
    assert rules.reprobe_wait(speculating=False, band=4) == 2      # the fallback measured speculation losing there
    assert rules.propose(fallen, plain, 3) is None
    back = rules.propose(fallen, plain, 4)
    assert back.kind == "speculation_probe" and back.config.spec_method == "ngram"
    assert [back.config.draft_len_for(b) for b in (1, 16)] == [8, 4]


def test_a_probe_of_plain_decoding_that_lost_at_one_band_does_not_hold_off_the_probe_at_the_next():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1}, "trial": {"retry_windows": 5}}))
    rules.state.unavailable.add("draft_model")
    current = EngineConfig(spec_method="ngram", draft_len=4)
    mixed = _window("ngram", 4, batch=6, seconds_per_step=0.03, accepted=0.6)
    probe = rules.propose(current, mixed, 1)
    assert probe.kind == "fallback_probe" and "batch band 3" in probe.reason
    rules.finished(probe, "reverted", None, 1)
    assert rules.propose(current, mixed, 2) is None                     # band 3 backs off
    heavy = rules.propose(current, _window("ngram", 4, batch=16, seconds_per_step=0.05, accepted=0.1), 2)
    assert heavy.kind == "fallback_probe" and "batch band 4" in heavy.reason


def test_a_probe_of_plain_decoding_where_no_other_band_drafts_turns_speculation_off():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1}}))
    rules.state.unavailable.add("draft_model")
    current = EngineConfig(spec_method="ngram", draft_len_schedule=((11, 0), (22, 4), (1024, 0)))
    probe = rules.propose(current, _window("ngram", 4, batch=16, seconds_per_step=0.05, accepted=0.1), 1)
    assert probe.kind == "fallback_probe" and probe.config.spec_method == "off" and "batch band" not in probe.reason


def test_a_drafter_that_lost_is_not_tried_again_at_any_k_within_retry_windows():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1000, "k_max": 4},
                                     "trial": {"retry_windows": 5}}))
    current = EngineConfig(spec_method="draft_model", draft_len=4)
    light = _window("draft_model", 4, batch=1, seconds_per_step=0.02, accepted=0.9)
    rules.observe(light)
    rules.observe(_window("ngram", 4, batch=1, seconds_per_step=0.012, accepted=0.9))
    switch = rules.propose(current, light, 1)
    assert switch.kind == "spec_method" and switch.config.spec_method == "ngram"
    rules.finished(switch, "inconclusive", None, 1)
    assert list(rules.state.rejected) == [("spec_method", "ngram")]       # the drafter, not the drafter at k 4
    assert all(p is None or p.kind != "spec_method" for p in (rules.propose(current, light, i) for i in range(2, 6)))
    assert rules.propose(current, light, 6).kind == "spec_method"


def test_a_probe_of_plain_decoding_is_left_out_where_the_model_measured_it_losing_by_the_re_enable_bar():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1, "k_max": 4}}))
    rules.state.unavailable.add("draft_model")
    current = EngineConfig(spec_method="ngram", draft_len=4)
    for k in (0, 2, 4):                                      # plain decoding measured at batch 1 too
        rules.observe(_window("ngram" if k else "off", k, batch=1, seconds_per_step=0.01, accepted=0.9))
    copying = _window("ngram", 4, batch=1, seconds_per_step=0.01, accepted=0.9)
    gain = rules.calibration.corrected("draft_len", rules.state.models["ngram"].gain(4, 0, 0))
    assert gain > 1.10                                       # k 4 beats plain by more than min_gain + hysteresis
    assert rules.propose(current, copying, 1) is None        # nothing to ask: no probe, k 4 is the model's best
    for k in (2, 4) * 4:                                     # the content stops matching the prompt
        rules.observe(_window("ngram", k, batch=1, seconds_per_step=0.01, accepted=0.05))
    assert rules.calibration.corrected("draft_len", rules.state.models["ngram"].gain(4, 0, 0)) < 1.10
    probe = rules.propose(current, _window("ngram", 4, batch=1, seconds_per_step=0.01, accepted=0.05), 2)
    assert probe.kind == "fallback_probe" and probe.config.draft_len_for(1) == 0
    assert probe.config.spec_method == "off"         # the larger batch sizes, never measured, follow batch 1


def test_a_probe_of_plain_decoding_is_left_out_where_the_model_predicts_it_losing_from_the_tokens_it_would_not_verify():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1, "k_max": 4}}))
    rules.state.unavailable.add("draft_model")
    current = EngineConfig(spec_method="ngram", draft_len=4)
    copying = _window("ngram", 4, batch=1, seconds_per_step=0.01, accepted=0.9)
    prose = _window("ngram", 4, batch=4, seconds_per_step=0.01, accepted=0.1)
    for window in (copying, copying, prose):                 # never plain: the price per verified token from two loads
        rules.observe(window)
    model = rules.state.models["ngram"]
    assert not model.measured_plain(0) and model.predicts_plain(0)
    assert rules.calibration.corrected("draft_len", model.gain(4, 0, 0)) > 1.10
    assert rules.propose(current, copying, 1) is None                    # k 4 beats plain by the bar: nothing to ask
    probe = rules.propose(current, prose, 2)                             # 4 sequences accepting little: asked
    assert probe.kind == "fallback_probe" and "batch band 2" in probe.reason


def _plain_shadowed(batch: float, seconds_per_step: float, shadow_accepted: float) -> Window:
    """A window of plain decoding whose shadow lookups drafted 8 tokens at each sequence-step, each accepted through
    position j with probability shadow_accepted ** (j + 1)."""
    lookups = 100 * round(batch)
    return dataclasses.replace(
        _window("ngram", 0, batch, seconds_per_step, 0.0), shadow_lookups=lookups,
        shadow_drafted_per_position=[lookups] * 8,
        shadow_accepted_per_position=[round(lookups * shadow_accepted ** (j + 1)) for j in range(8)])


def test_a_probe_of_speculation_is_left_out_while_plain_decodings_shadow_shows_it_losing():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1, "k_max": 4}}))
    rules.state.unavailable.add("draft_model")
    for k in (2, 4):                                         # speculation's costs measured at batch 4 earlier
        rules.observe(_window("ngram", k, batch=4, seconds_per_step=0.01, accepted=0.1))
    current = EngineConfig(spec_method="ngram", draft_len_schedule=((2, 4), (5, 0), (1024, 4)))   # plain at 3-5
    prose = _plain_shadowed(4, 0.01, shadow_accepted=0.1)
    rules.observe(prose)
    assert rules.propose(current, prose, 1) is None
    unshadowed = dataclasses.replace(prose, shadow_lookups=0, shadow_drafted_per_position=None,
                                     shadow_accepted_per_position=None)
    assert rules.propose(current, unshadowed, 2).kind == "speculation_probe"    # without a shadow: probed blind
    copying = _plain_shadowed(4, 0.01, shadow_accepted=0.95)                    # the content starts to repeat
    rules.observe(copying)
    rules.observe(copying)
    probe = rules.propose(current, copying, 3)
    assert probe.kind == "speculation_probe" and probe.config.draft_len_for(4) > 0


def test_a_probe_of_speculation_carries_its_prediction_and_those_that_lose_back_off_at_their_band():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1, "k_max": 4, "reprobe_backoff_max": 4},
                                     "trial": {"retry_windows": 1}}))
    rules.state.unavailable.add("draft_model")
    for k in (2, 4):
        rules.observe(_window("ngram", k, batch=4, seconds_per_step=0.01, accepted=0.1))
    current = EngineConfig(spec_method="ngram", draft_len_schedule=((2, 4), (5, 0), (1024, 4)))   # plain at 3-5
    copying = _plain_shadowed(4, 0.01, shadow_accepted=0.95)
    rules.observe(copying)
    rules.observe(copying)

    def probes(windows: range) -> list[int]:
        found = []
        for index in windows:
            probe = rules.propose(current, copying, index)
            if probe is not None:
                assert probe.kind == "speculation_probe" and probe.raw_gain > 1.10
                assert f"predicts {probe.raw_gain:.3f}x" in probe.reason
                rules.finished(probe, "reverted", None, index)      # speculation lost again
                found.append(index)
        return found

    assert probes(range(1, 20)) == [1, 3, 7, 11, 15, 19]      # waits 2, 4, 4: at most 4 x reprobe_windows
    rules.released(current)
    assert probes(range(20, 22)) == [20]


def test_a_probe_of_plain_decoding_covers_every_larger_batch_size_measured_or_not():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1}}))
    rules.state.unavailable.add("draft_model")
    rules.observe(_window("ngram", 4, batch=24, seconds_per_step=0.05, accepted=0.1))    # 23+ sequences: k 4 measured
    current = EngineConfig(spec_method="ngram", draft_len_schedule=((1, 8), (1024, 4)))
    probe = rules.propose(current, _window("ngram", 4, batch=16, seconds_per_step=0.05, accepted=0.1), 1)
    assert probe.kind == "fallback_probe" and "batch band 4" in probe.reason
    assert [probe.config.draft_len_for(b) for b in (1, 11, 12, 22, 23, 5000)] == [8, 4, 0, 0, 0, 0]


def test_no_trial_of_one_bands_k_or_mode_while_the_load_crosses_bands():
    rules = RulePolicy(parse_policy({"speculation": {"reprobe_windows": 1}}))
    rules.state.unavailable.add("draft_model")
    current = EngineConfig(spec_method="ngram", draft_len=4)
    heavy = _window("ngram", 4, batch=22, seconds_per_step=0.05, accepted=0.1)      # median step: 22, band 4

    def split(at_22: int) -> Window:                    # 100 steps: at_22 of them at 22 sequences, the rest at 23
        return dataclasses.replace(heavy, by_band={4: dataclasses.replace(heavy, steps=at_22),
                                                   5: dataclasses.replace(heavy, steps=100 - at_22)})
    assert rules.propose(current, split(55), 1) is None                 # hovering at the edge of bands 4 and 5
    probe = rules.propose(current, split(80), 2)                        # settled in band 4
    assert probe.kind == "fallback_probe" and "batch band 4" in probe.reason
