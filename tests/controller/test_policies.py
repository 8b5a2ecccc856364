"""Policy files: shipped ones pass `governor policy check`; bad ones name the file, the field and what is allowed."""
import pytest

from governor.cli import main
from policies import PolicyError, load_policy, shipped_policies


@pytest.mark.parametrize("name", ["default", "optuna"])
def test_shipped_policies_pass_policy_check(name, capsys):
    assert main(["policy", "check", f"policies/{name}.yaml"]) == 0
    out = capsys.readouterr().out
    assert f"policies/{name}.yaml: ok, {load_policy(name).kind} policy" in out


def test_shipped_policy_names_resolve():
    assert set(shipped_policies()) >= {"default", "optuna"}
    assert load_policy("optuna").kind == "optuna"


@pytest.mark.parametrize("text, field, allowed", [
    ("speculation:\n  min_gain: 0.5\n", "speculation.min_gain", "allowed: >= 1.0, <= 100.0"),
    ("window:\n  seconds: 0\n", "window.seconds", "allowed: > 0, <= 3600"),
    ("kind: bandit\n", "kind", "'rules' or 'optuna'"),
    ("trial:\n  keep: 1\n", "trial.keep", "allowed fields: min_predicted_gain, keep_gain, cooldown_windows"),
    ("alerts:\n  overrides:\n    HighLatency: reboot\n", "alerts.overrides.HighLatency",
     "'rollback', 'disable_speculation', 'pin' or 'notify'"),
    ("capacity:\n  min_factor: 3\n  max_factor: 2\n", "capacity", "must be <= max_factor"),
    ("judge:\n  confidence: 1.0\n", "judge.confidence", "allowed: >= 0.5, < 1.0"),
    ("judge:\n  block_steps: 0\n", "judge.block_steps", "allowed: >= 1, <= 10000"),
    ("judge:\n  min_samples: 10\n  max_blocks: 12\n", "judge.max_blocks", "must be >= 2 * min_samples (20)"),
    ("judge:\n  margin: 0\n", "judge.margin", "allowed: > 0.0, <= 1.0"),
    ("judge:\n  futility_confidence: 1\n", "judge.futility_confidence", "allowed: >= 0.5, < 1.0"),
    ("judge:\n  looks: 3\n", "judge.looks", "allowed fields: block_steps, confidence, min_samples, max_blocks"),
])
def test_policy_check_names_file_field_and_allowed_values(tmp_path, capsys, text, field, allowed):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["policy", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {field}: " in err
    assert allowed in err


def test_policy_file_cannot_run_code(tmp_path):
    path = tmp_path / "evil.yaml"
    marker = tmp_path / "ran"
    path.write_text(f"kind: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(path)
    assert not marker.exists()


def test_missing_and_non_mapping_files_are_clear_errors(tmp_path):
    with pytest.raises(PolicyError, match="nothing.yaml: \\(file\\): No such file"):
        load_policy(tmp_path / "nothing.yaml")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(PolicyError, match="must be a mapping of sections, got list"):
        load_policy(listed)
