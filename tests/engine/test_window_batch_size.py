"""Where a window's load was: the steps it ran at each batch size, the batch size of its median step (which the
window's k and the controller's batch band follow: a mean over a window that spans a change in load lies between the
two loads, at batch sizes few of its steps ran), and each batch band's steps as a window of their own."""
import dataclasses
import json

import pytest

from controller.decide.goodput import GoodputModel
from controller.window_stats import merge_windows, window_from_dict
from engine.telemetry.recorder import StepRecord, Telemetry
from seam import EngineConfig

SCHEDULE = EngineConfig(spec_method="ngram", draft_len_schedule=((2, 8), (64, 2)))    # batch 1-2: k 8, above: k 2


def _window(telemetry: Telemetry, batch_sizes: list[int]):
    for batch in batch_sizes:
        telemetry.record_step(StepRecord(batch_size=batch, queue_depth=0, step_seconds=0.1, target_seconds=0.08,
                                         draft_seconds=0.01, drafted_per_position=[batch] * 2,
                                         accepted_per_position=[batch, 0], num_drafts=batch, prefill_tokens=0))
    return telemetry.snapshot(SCHEDULE)


def test_the_window_counts_steps_per_batch_size_and_drafts_the_k_of_its_median_step():
    window = _window(Telemetry(), [1, 1, 1] + [3] * 7)       # one request left over beside two new ones
    assert window.steps_per_batch_size == [0, 3, 0, 7]
    assert window.batch_size_mean == 2.4 and window.batch_size_median == 3
    assert window.draft_len == 2                              # the k at 3 sequences; the mean's 2 would say 8


def test_merged_windows_add_their_steps_and_the_median_follows_the_most_steps():
    telemetry = Telemetry()
    first, second = _window(telemetry, [3] * 7), _window(telemetry, [1] * 9)
    merged = merge_windows([first, second])
    assert merged.steps_per_batch_size == [0, 9, 0, 7] and merged.batch_size_median == 1


def test_the_goodput_model_files_a_window_without_bands_under_its_median_steps_band():
    window = _window(Telemetry(), [1, 1, 1] + [3] * 7)
    model = GoodputModel()
    model.observe(dataclasses.replace(window, by_band=None))
    assert set(model.bands) == {2}                            # batch 3 (band 2: 3-5), not the mean's 2.4 (band 1)


def test_a_window_without_step_counts_falls_back_to_its_mean():
    window = _window(Telemetry(), [2, 2, 3])
    legacy = dataclasses.replace(window, steps_per_batch_size=None)
    assert legacy.batch_size_median == 2


def test_each_batch_bands_steps_are_a_window_of_their_own_and_teach_that_band_alone():
    window = _window(Telemetry(), [1, 1, 1] + [3] * 7)
    light, heavy = window.by_band[0], window.by_band[2]
    assert set(window.by_band) == {0, 2} and (light.steps, heavy.steps) == (3, 7)
    assert (light.draft_len, heavy.draft_len) == (8, 2)            # each band's k from the schedule
    assert light.batch_size_mean == 1 and light.drafted_per_position == [3, 3]
    assert heavy.target_forward_seconds == pytest.approx(7 * 0.08)
    model = GoodputModel()
    model.observe(window)
    assert set(model.bands) == {0, 2}
    assert model.bands[0].verify.per_k == {8: pytest.approx(0.09)} and model.bands[2].verify.per_k == {
        2: pytest.approx(0.09)}                                   # a step's seconds but its drafter's


def test_the_bands_survive_json_and_merging():
    telemetry = Telemetry()
    first, second = _window(telemetry, [1] * 4 + [3] * 2), _window(telemetry, [3] * 5 + [16])
    remote = window_from_dict(json.loads(json.dumps(first.to_dict())))
    assert remote.by_band.keys() == {0, 2} and remote.by_band[2].steps == 2
    merged = merge_windows([remote, second])
    assert {band: w.steps for band, w in merged.by_band.items()} == {0: 4, 2: 7, 4: 1}


def test_decode_steps_sum_their_cost_terms_per_band_and_prefills_are_left_out():
    """s is a step's seconds but its drafter's: the target's forward and sampling what it verified."""
    telemetry = Telemetry()
    steps = ((1, [1, 1], 0.03, 0.01, 0), (1, [], 0.02, 0.0, 0), (1, [], 0.50, 0.0, 300), (4, [4], 0.05, 0.02, 0))
    for batch, drafted, verify, draft, prefill in steps:
        telemetry.record_step(StepRecord(batch_size=batch, queue_depth=0, step_seconds=verify + draft,
                                         target_seconds=0.8 * verify, draft_seconds=draft,
                                         drafted_per_position=drafted, accepted_per_position=[0] * len(drafted),
                                         num_drafts=0, prefill_tokens=prefill))
    window = telemetry.snapshot(SCHEDULE)
    #                   steps  Σb  Σd   Σs    Σb²  Σbd  Σd²  Σbs   Σds   Σs²   Σdraft Σz  Σzb  Σzs (z: drafted none)
    assert window.by_band[0].decode_cost_sums == pytest.approx([2, 2, 2, 0.05, 2, 2, 4, 0.05, 0.06, 0.0013, 0.01,
                                                                1, 1, 0.02])
    assert window.by_band[2].decode_cost_sums == pytest.approx([1, 4, 4, 0.05, 16, 16, 16, 0.2, 0.2, 0.0025, 0.02,
                                                                0, 0, 0])
    assert window.decode_cost_sums == pytest.approx([a + b for a, b in zip(window.by_band[0].decode_cost_sums,
                                                                            window.by_band[2].decode_cost_sums)])
    remote = window_from_dict(json.loads(json.dumps(window.to_dict())))
    assert merge_windows([remote, window]).by_band[0].decode_cost_sums == pytest.approx(
        [2 * x for x in window.by_band[0].decode_cost_sums])
