"""`governor bench controller --quick`: every arm served in-process, figures in JSON and a PNG (targets not checked)."""
from governor.cli import main

BENCH = ["controller", "--quick"]
RESULT = "controller"
PHASES = ["code-greedy", "prose-hot", "code-shifted-qps"]


def test_writes_a_timeline_plot(out):
    png = (out / "controller.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_every_arm_has_goodput_and_latency_per_phase(data):
    assert data["command"].startswith("governor bench controller") and "--quick" in data["command"]
    assert [p["name"] for p in data["phases"]] == PHASES
    assert set(data["arms"]) == {"plain", "ngram k=4", "controller"}
    for arm in data["arms"].values():
        assert list(arm["phases"]) == PHASES
        for phase in arm["phases"].values():
            assert phase["completed"] > 0 and phase["itl_p99_s"] > 0
            assert 0 <= phase["slo_met"] <= phase["requests"]
        assert arm["overall"]["goodput_tokens_per_s"] > 0


def test_oracle_takes_the_best_static_arm_of_each_phase(data):
    for name, best in data["oracle"]["phases"].items():
        assert best["arm"] in ("plain", "ngram k=4")
        static = [data["arms"][a]["phases"][name]["goodput_tokens_per_s"] for a in ("plain", "ngram k=4")]
        assert best["goodput_tokens_per_s"] == max(static)


def test_controller_record_and_targets(data):
    controller = data["controller"]
    assert controller["decisions"][0]["action"] == "start"
    assert controller["config_changes"] == len(controller["applies"])
    assert [r["phase"] for r in controller["retune"]] == PHASES
    assert all(d["measured_gain"] is not None for d in controller["predicted_vs_measured"])
    assert set(data["targets"]) == {"oracle_ratio", "best_static_ratio", "low_acceptance_vs_plain"}
    for target in data["targets"].values():
        assert target["met"] == (target["value"] >= target["target"])


def test_bad_policy_is_exit_2(tmp_path, capsys):
    assert main(["bench", "controller", "--quick", "--policy", "no-such-policy", "--out", str(tmp_path)]) == 2
    assert "--policy: no-such-policy" in capsys.readouterr().err
