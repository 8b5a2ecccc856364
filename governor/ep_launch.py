"""`governor serve` under torchrun: rank 0 serves HTTP and drives the engine, every other rank is a worker.

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr NODE0 --master-port 29500 \
        $(which governor) serve --host 0.0.0.0 --port 8000      # and --node-rank 1 on the second node

A worker needs no model flags: rank 0 sends it the target loader, the expert topology and the engine's limits.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import torch

from engine.moe.ep import serve_worker
from engine.moe.ep_channel import GroupMember, RankLaunchError


def torchrun_member(ep: int) -> GroupMember | None:
    """The rank torchrun launched this process as, None without torchrun; RankLaunchError when that launch cannot
    serve (ep: the --ep given, 1 when none was)."""
    member = GroupMember.from_torchrun()
    if member is not None and member.rank == 0:
        warn_about_shared_store_restarts()
    if member is not None and ep not in (1, member.world):
        raise RankLaunchError(f"--ep {ep} disagrees with torchrun's {member.world} ranks (leave --ep out under "
                              "torchrun)")
    return member


def warn_about_shared_store_restarts(environ: Mapping[str, str] = os.environ) -> None:
    """torchrun restarts on its own shared store hang on the previous round's keys (pytorch#135712)."""
    restarts = int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts > 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        print("governor serve: warning: torchrun --max-restarts with its shared store cannot restart this group "
              "(the ranks would find the last round's addresses); launch with --rdzv-backend c10d and "
              "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", file=sys.stderr, flush=True)


def run_worker(member: GroupMember) -> int:
    """Serve as a worker rank until rank 0 stops the group (0) or the group fails (1, for torchrun to restart)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    print(f"governor: expert-parallel rank {member.rank} of {member.world}, joining rank 0 at {member.address}",
          file=sys.stderr, flush=True)
    try:
        serve_worker(member, backend)
    except Exception as error:      # any failure ends this rank; torchrun restarts the group from its exit status
        print(f"governor serve: expert-parallel rank {member.rank}: {error}", file=sys.stderr)
        return 1
    return 0
