"""`governor bench controller --quick`: closed-loop phases, repetitions with the arm order rotated, each ratio as a
mean with a 95 % interval, the controller's calibration, and a timeline PNG (targets reported, not checked)."""
import pytest

from governor.bench.controller_vs_static import REFERENCE_PROSE_TOKENS_PER_SECOND, auto_slo_scale
from governor.cli import main
from policies import load_policy

BENCH = ["controller", "--quick"]
RESULT = "controller"
PHASES = ["copy", "code", "mixed", "prose-hot"]
ARMS = {"plain", "ngram k=8", "controller"}   # SmolLM2 speculates by prompt lookup
RATIOS = ("controller_vs_oracle", "controller_vs_best_static", "oracle_vs_best_static", "low_acceptance_phase_vs_plain")


def test_writes_a_timeline_plot(out):
    png = (out / "controller.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_phases_differ_in_content_and_concurrency(data):
    assert data["command"].startswith("governor bench controller") and "--quick" in data["command"]
    assert [p["name"] for p in data["phases"]] == PHASES
    assert [p["concurrency"] for p in data["phases"]] == [1, 2, 6, 16]
    assert data["phases"][2]["requests_kinds"] == ["code", "copy", "prose-hot"]


def test_repetitions_rotate_the_arm_order(data):
    runs = data["repetitions"]
    assert data["summary"]["repetitions"] == len(runs) == 2
    assert [set(run["order"]) for run in runs] == [ARMS, ARMS] and runs[0]["order"] != runs[1]["order"]
    assert runs[1]["order"] == runs[0]["order"][1:] + runs[0]["order"][:1]
    for run in runs:
        for arm in run["arms"].values():
            assert list(arm["phases"]) == PHASES and arm["requests"] >= max(arm["finished"], 1)
        assert any(arm["finished"] for arm in run["arms"].values())


def test_each_ratio_is_a_mean_with_its_interval_over_the_repetitions(data):
    for key in RATIOS:
        summary = data["summary"][key]
        values = [run["ratios"][key] for run in data["repetitions"]]
        assert summary["values"] == values
        assert abs(summary["mean"] - sum(values) / len(values)) < 1e-9
        assert summary["ci95"][0] <= summary["mean"] <= summary["ci95"][1]
        assert data["targets"][key]["met"] == (summary["mean"] >= data["targets"][key]["target"])


def test_oracle_takes_the_best_static_arm_of_each_phase(data):
    for run in data["repetitions"]:
        for phase, arm in run["ratios"]["oracle_arms"].items():
            static = {name: run["arms"][name]["phases"][phase] for name in ARMS - {"controller"}}
            assert static[arm] == max(static.values())


def test_the_controller_is_measured_on_its_last_pass_and_its_first_is_reported(data):
    assert data["controller_passes"] == 2
    for run in data["repetitions"]:
        assert list(run["controller_first_pass"]["phases"]) == PHASES
        oracle = run["ratios"]["oracle_goodput"]
        first = run["controller_first_pass"]["overall"] / oracle if oracle > 0 else 0.0
        assert run["ratios"]["controller_first_pass_vs_oracle"] == first
    summary = data["summary"]["controller_first_pass_vs_oracle"]
    assert summary["values"] == [run["ratios"]["controller_first_pass_vs_oracle"] for run in data["repetitions"]]


def test_the_controller_record_and_its_calibration(data):
    for run in data["repetitions"]:
        controller = run["controller"]
        assert controller["decisions"][0]["action"] == "start"
        assert controller["decisions"][0]["seconds"] < 0          # it started in the first pass
        assert controller["config_changes"] == len(controller["applies"])
    calibration = data["calibration"]
    assert calibration["predicted_trials"] == len(calibration["checks"])
    assert calibration["trials_kept"] <= calibration["trials_proposed"]
    assert calibration["predicted_trials_kept"] <= calibration["predicted_trials_ended"] <= calibration["trials_proposed"]


def test_bad_policy_is_exit_2(tmp_path, capsys):
    assert main(["bench", "controller", "--quick", "--policy", "no-such-policy", "--out", str(tmp_path)]) == 2
    assert "--policy: no-such-policy" in capsys.readouterr().err


def test_latency_bounds_are_scaled_to_this_machines_speed(data):
    slo, responsive = data["slo"], load_policy("responsive").slo
    assert slo["scale"] == auto_slo_scale(slo["plain_prose_tokens_per_second"])    # the floor: the test below
    assert slo["inter_token_p99_seconds"] == responsive.inter_token_p99_seconds * slo["scale"]
    assert slo["ttft_p99_seconds"] == responsive.ttft_p99_seconds * slo["scale"]


def test_the_scale_is_how_many_times_slower_this_machine_is_never_below_one():
    assert auto_slo_scale(REFERENCE_PROSE_TOKENS_PER_SECOND / 3) == pytest.approx(3.0)
    assert auto_slo_scale(REFERENCE_PROSE_TOKENS_PER_SECOND * 2) == 1.0
    assert auto_slo_scale(0.0) == 100.0


def test_a_scale_below_one_is_refused_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "controller", "--quick", "--slo-scale", "0.5", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "--slo-scale" in capsys.readouterr().err
