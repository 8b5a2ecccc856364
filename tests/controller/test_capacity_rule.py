"""The capacity-factor rule, against the Window and EngineConfig fields the MoE capacity work adds (dropped_tokens,
capacity_factor). Until those land in engine/, the test declares them on subclasses of the real types."""
import dataclasses

from pydantic import Field

from controller.rules import RulePolicy
from engine.config import EngineConfig
from engine.window import LatencySummary, Window
from policies import parse_policy


class CapacityConfig(EngineConfig):
    capacity_factor: float = Field(1.0, ge=0.0)


@dataclasses.dataclass(frozen=True)
class CapacityWindow(Window):
    dropped_tokens: int = 0


def _window(dropped: int, routed: int = 10_000) -> CapacityWindow:
    empty = LatencySummary.of([])
    return CapacityWindow(
        start=0.0, end=1.0, config_version=1, spec_method="off", draft_len=0, steps=100, num_drafts=0,
        drafted_tokens=0, accepted_tokens=0, drafted_per_position=[], accepted_per_position=[], emitted_tokens=500,
        prefill_tokens=0, finished_requests=5, target_forward_seconds=0.5, draft_forward_seconds=0.0,
        step_seconds=0.6, ttft_seconds=empty, inter_token_seconds=empty, e2e_seconds=empty, batch_size_mean=4.0,
        batch_size_max=4, queue_depth_mean=0.0, queue_depth_max=0, expert_tokens=[[routed // 8] * 8],
        dropped_tokens=dropped)


RULES = parse_policy({"capacity": {"min_factor": 1.0, "max_factor": 2.0, "step": 0.25, "max_drop_rate": 0.01,
                                   "max_padding_waste": 0.3}, "speculation": {"reprobe_windows": 1000}})


def test_drops_above_the_bound_raise_the_capacity_factor():
    proposal = RulePolicy(RULES).propose(CapacityConfig(spec_method="off", capacity_factor=1.25), _window(500), 1)
    assert proposal.kind == "capacity_factor" and proposal.config.capacity_factor == 1.5
    assert proposal.inputs["drop_rate"] == 0.05


def test_padding_waste_without_drops_lowers_it_and_within_bounds_nothing_changes():
    lower = RulePolicy(RULES).propose(CapacityConfig(spec_method="off", capacity_factor=2.0), _window(0), 1)
    assert lower.config.capacity_factor == 1.75 and lower.inputs["padding_waste"] == 0.5
    assert RulePolicy(RULES).propose(CapacityConfig(spec_method="off", capacity_factor=1.25), _window(0), 1) is None
    assert RulePolicy(RULES).propose(CapacityConfig(spec_method="off", capacity_factor=2.0), _window(500), 1) is None


def test_dropless_and_engines_without_capacity_figures_are_left_alone():
    assert RulePolicy(RULES).propose(CapacityConfig(spec_method="off", capacity_factor=0.0), _window(500), 1) is None
    window = _window(500)
    plain = Window(**{field.name: getattr(window, field.name) for field in dataclasses.fields(Window)})
    assert RulePolicy(RULES).propose(EngineConfig(spec_method="off"), plain, 1) is None
