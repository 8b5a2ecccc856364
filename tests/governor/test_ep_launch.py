"""What `governor serve` makes of torchrun's environment, before it loads anything."""
import pytest

from engine.moe.ep_channel import GroupMember, RankLaunchError
from governor.cli import main
from governor.ep_launch import warn_about_shared_store_restarts

TORCHRUN = {"TORCHELASTIC_RUN_ID": "run", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_a_process_torchrun_did_not_launch_is_no_member():
    assert GroupMember.from_torchrun({"PATH": "/usr/bin"}) is None


def test_torchrun_environment_names_the_rank_and_the_rendezvous():
    assert GroupMember.from_torchrun(TORCHRUN) == GroupMember(1, 2, 0, "env://")


def test_an_incomplete_environment_names_what_is_missing():
    with pytest.raises(RankLaunchError, match="MASTER_ADDR, MASTER_PORT is not set"):
        GroupMember.from_torchrun({**TORCHRUN, "MASTER_ADDR": "", "MASTER_PORT": ""})


def test_one_rank_is_no_expert_parallel_group():
    with pytest.raises(RankLaunchError, match="group of 1 rank"):
        GroupMember.from_torchrun({**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1"})


def test_serve_refuses_an_ep_that_disagrees_with_torchrun(monkeypatch, capsys):
    for name, value in {**TORCHRUN, "RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--ep", "4", "--no-controller"]) == 2
    assert "--ep 4 disagrees with torchrun's 2 ranks" in capsys.readouterr().err


def test_rank_0_warns_that_torchrun_restarts_need_their_own_store(capsys):
    warn_about_shared_store_restarts({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in capsys.readouterr().err
    warn_about_shared_store_restarts({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "False"})
    warn_about_shared_store_restarts({"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert capsys.readouterr().err == ""
