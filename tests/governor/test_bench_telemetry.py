"""`governor bench telemetry --quick`: both arms measured in interleaved repetitions, JSON + PNG written."""
import statistics

import pytest

from governor.cli import main

BENCH = ["telemetry", "--quick"]
RESULT = "telemetry"


def test_writes_a_plot(out):
    assert (out / "telemetry.png").stat().st_size > 10_000


def test_measures_both_arms_in_every_repetition(data):
    reps = data["settings"]["repetitions"]
    assert len(data["tokens_per_second"]["off"]) == len(data["tokens_per_second"]["on"]) == reps
    assert all(v > 0 for arm in data["tokens_per_second"].values() for v in arm)


def test_ratio_is_the_median_of_the_same_repetition_ratios(data):
    pairs = [on / off for on, off in zip(data["tokens_per_second"]["on"], data["tokens_per_second"]["off"])]
    assert data["pair_ratios"] == pytest.approx(pairs)
    assert data["ratio"] == pytest.approx(statistics.median(pairs))
    assert data["target_met"] == (data["ratio"] >= 0.97)


def test_records_the_command_and_the_machine(data):
    assert data["command"].startswith("governor bench telemetry") and "--quick" in data["command"]
    assert {"date", "cpu", "torch"} <= data["machine"].keys()


def test_refuses_a_non_positive_repetition_count(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "telemetry", "--repetitions", "0"])
    assert exit_info.value.code == 2
    assert "--repetitions" in capsys.readouterr().err
