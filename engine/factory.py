"""Build an Engine from loaded models: in one process, or as rank 0 of an expert-parallel group."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.engine import Engine
from engine.model.tokenizer import Tokenizer
from engine.model.transformer import Transformer
from engine.moe.ep import ExpertParallel, TargetLoader
from engine.moe.ep_channel import GroupMember
from engine.moe.experts import drop_logical_experts, expert_topology
from engine.runtime.limits import EngineLimits
from engine.telemetry.recorder import TelemetrySink
from seam import EngineConfig, SpecMethod


@dataclass
class LoadedModels:
    name: str
    target: Transformer
    tokenizer: Tokenizer
    draft: Transformer | None
    draft_name: str | None
    spec_method: SpecMethod = "ngram"          # what the model speculates with unless a config says otherwise
    target_loader: TargetLoader | None = None  # loads the target again in an expert-parallel rank (picklable)


def build_engine(models: LoadedModels, config: EngineConfig | None = None, limits: EngineLimits = EngineLimits(),
                 ep: int = 1, redundant_experts: int = 0, sinks: Sequence[TelemetrySink] = (),
                 member: GroupMember | None = None) -> Engine:
    """ep > 1 spawns ep - 1 worker ranks, or with member (torchrun's rank 0) joins the ep - 1 that torchrun
    launched; they load the target themselves (models.target_loader) and the target then keeps only rank 0's
    expert slots. Raises ValueError for a combination that cannot be served (e.g. ep > 1 on a dense model)."""
    config = config or EngineConfig(spec_method=models.spec_method)
    if not models.target.moe_blocks:
        if ep > 1 or redundant_experts:
            raise ValueError(f"--ep and --redundant-experts need an MoE model; {models.name} is dense")
        return Engine(models.target, models.tokenizer, models.draft, config, limits, sinks)
    if ep == 1:
        topology = expert_topology(models.target.spec.num_experts, 1, redundant_experts)
        return Engine(models.target, models.tokenizer, models.draft, config, limits, sinks, topology=topology)
    if models.target_loader is None:
        raise ValueError(f"--ep {ep}: {models.name} was loaded without a way to load it again in the worker ranks")
    group = ExpertParallel(models.target_loader, ep, models.target, limits, redundant_experts=redundant_experts,
                           member=member)
    try:
        engine = Engine(models.target, models.tokenizer, models.draft, config, limits, sinks, ep=group)
    except Exception:
        group.close()
        raise
    drop_logical_experts(models.target)
    return engine
