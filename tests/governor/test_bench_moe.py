"""`governor bench moe --quick`: real EP=2 ranks on the CPU, figures in JSON and a PNG."""
import pytest

from governor.cli import main

BENCH = ["moe", "--part", "runtime", "--quick", "--capacity-factors", "0.5", "0"]
RESULT = "moe"


def test_writes_a_plot(out):
    assert (out / "moe.png").stat().st_size > 10_000


def test_records_the_machine_and_the_command(data):
    assert {"date", "cpu", "torch"} <= data["machine"].keys()
    assert data["command"].startswith("governor bench moe") and "--quick" in data["command"]


def test_compares_expert_parallelism_with_one_process(data):
    assert data["one_process"]["comm_share"] == 0 and data["one_process"]["balancedness"] == 1
    assert [p["capacity_factor"] for p in data["expert_parallel"]] == [0.5, 0.0]
    assert all(0 < p["comm_share"] < 1 and 0 < p["balancedness"] <= 1 for p in data["expert_parallel"])
    assert data["ep_over_one_process"] == pytest.approx(
        data["expert_parallel"][1]["tokens_per_second"] / data["one_process"]["tokens_per_second"])


def test_drop_rate_follows_the_capacity_factor(data):
    tight, dropless = data["expert_parallel"]
    assert tight["drop_rate"] > 0 and tight["dropped_tokens"] > 0
    assert dropless["drop_rate"] == 0 and dropless["dropped_tokens"] == 0


def test_measures_the_replacement_stall(data):
    assert len(data["replacement"]["runs"]) == 3 and all(s > 0 for s in data["replacement"]["runs"])


def test_places_experts_by_measured_heat_with_the_planner(data):
    """The same greedy prompts route the same way, so a placement planned from their heat serves them strictly more
    evenly than the identity placement it replaces, and it is not the identity."""
    placement = data["placement"]
    before, after = placement["before"], placement["after"]
    assert before["balancedness"] < 0.95, "the quick run's heat is skewed: there is something to re-place"
    assert before["balancedness"] < after["balancedness"] <= 1
    assert placement["phy2log"] != [list(range(len(layer))) for layer in placement["phy2log"]]
    assert sorted({e for layer in placement["phy2log"] for e in layer}) == list(range(8))


def test_refuses_a_capacity_factor_out_of_range(tmp_path, capsys):
    assert main(["bench", "moe", "--capacity-factors", "20", "--out", str(tmp_path)]) == 2
    assert "--capacity-factors" in capsys.readouterr().out and not list(tmp_path.iterdir())
