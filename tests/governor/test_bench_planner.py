"""`governor bench moe --part planner --quick`: JSON and PNG, every planner on every load, the peer beaten or tied."""
import math

BENCH = ["moe", "--part", "planner", "--quick"]
RESULT = "moe_planner"


def test_writes_a_plot(out):
    assert (out / "moe_planner.png").stat().st_size > 10_000


def test_records_the_machine_and_the_command(data):
    assert {"date", "cpu", "load_average"} <= data["machine"].keys()
    assert data["command"].startswith("governor bench moe --part planner") and "--quick" in data["command"]


def test_every_skew_with_and_without_spare_slots(data):
    assert [(c["skew"], c["spare_slots"]) for c in data["cases"]] == [(s, spare) for spare in (0, 64)
                                                                       for s in (0.0, 1.0, 2.0)]
    for case in data["cases"]:
        assert case["balancedness"].keys() == {"identity", "eplb_hierarchical", "eplb_global", "ours"}
        assert all(0 < value <= 1 for value in case["balancedness"].values())
        assert all(math.isfinite(s) and s > 0 for s in case["plan_seconds"].values())


def test_ours_is_at_least_as_balanced_as_either_eplb_policy_on_every_load(data):
    for case in data["cases"]:
        peer = max(case["balancedness"]["eplb_hierarchical"], case["balancedness"]["eplb_global"])
        assert case["balancedness"]["ours"] >= peer and case["ours_over_eplb"] >= 1
    assert data["targets"][0]["met"]


def test_the_speed_target_is_not_claimed_from_a_quick_run(data):
    assert data["targets"][1]["met"] is False and "50 ms" in data["targets"][1]["target"]


def test_counts_experts_split_over_nodes_and_eplb_hierarchical_splits_none(data):
    for case in data["cases"]:
        assert case["split_experts"]["eplb_hierarchical"] == 0
        assert case["split_experts"]["ours"] <= case["spare_slots"] * data["settings"]["layers"]
