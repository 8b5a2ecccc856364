"""The policy file's schema: thresholds, SLOs, search space and alert actions. Data only, never code."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from seam import MAX_DRAFT_LEN, SpecMethod

AlertAction = Literal["rollback", "disable_speculation", "pin", "notify"]
SHIPPED = Path(__file__).parent


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WindowPolicy(_Section):
    seconds: float = Field(5.0, gt=0, le=3600, description="one measurement window; a trial is held this long")
    checks: int = Field(4, ge=1, le=60, description="SLO checks per window; a trial breaking the SLO is cut short")
    min_emitted_tokens: int = Field(200, ge=1, description="less traffic than this is 'no data': never judged")
    min_steps: int = Field(20, ge=1, description="fewer engine steps than this is 'no data'")
    max_stretch: int = Field(4, ge=1, le=100, description=(
        "a window short of min_emitted_tokens or min_steps goes on, up to this many times seconds, before it is "
        "'no data': on a slow machine or under light traffic a window then holds enough to judge; 1: never"))


class SLOPolicy(_Section):
    inter_token_p99_seconds: float | None = Field(0.5, gt=0, description="p99 inter-token latency bound")
    ttft_p99_seconds: float | None = Field(5.0, gt=0, description="p99 time-to-first-token bound")
    builtin_evaluator: bool = Field(True, description="raise alerts from the Window's latency when no Prometheus runs")


class SpeculationPolicy(_Section):
    k_max: int = Field(8, ge=1, le=MAX_DRAFT_LEN, description="largest draft length the controller may choose")
    k_step: int = Field(2, ge=1, le=MAX_DRAFT_LEN,
                        description="how far past the draft lengths already measured one trial may go")
    min_gain: float = Field(1.05, ge=1.0, le=100.0,
                            description="keep speculation only while it beats plain decoding by this factor")
    hysteresis: float = Field(0.05, ge=0.0, le=10.0,
                              description="re-enable only at a gain of min_gain + hysteresis")
    reprobe_windows: int = Field(10, ge=1, description="windows between probes of the other mode")
    reprobe_backoff_max: int = Field(8, ge=1, le=1024, description=(
        "the wait between probes of the other mode at a batch band doubles after each one that mode lost there "
        "(a kept probe counts as one loss for the mode it replaced), up to this many times reprobe_windows; 1: every "
        "reprobe_windows"))


class TrialPolicy(_Section):
    min_predicted_gain: float = Field(1.05, ge=1.0, le=100.0,
                                      description="propose a change only if the model predicts this much gain")
    keep_gain: float = Field(1.0, gt=0.0, le=100.0,
                             description="keep a trial when the judge's lower bound of candidate / incumbent "
                                         "decode throughput clears this")
    cooldown_windows: int = Field(0, ge=0, description="windows to wait after a rollback before the next trial")
    retry_windows: int = Field(10, ge=1, description="windows before a reverted candidate may be tried again (a "
                                                     "drafter: at any k)")
    mode: Literal["switchback", "canary"] = Field(
        "switchback", description="switchback: every replica alternates candidate and incumbent; canary (with >= 2 "
                                  "replicas answering): canary_replicas run the candidate, judged against the others "
                                  "over the same checks, and it reaches the rest only if kept")
    canary_replicas: int = Field(1, ge=1, description="replicas that run a canary's candidate (the others, at least "
                                                      "one, stay on the incumbent)")


class JudgePolicy(_Section):
    """How a trial is run and judged: a switchback experiment of alternating blocks, decided by
    controller.trials.judge."""
    block_steps: int = Field(1, ge=1, le=10_000, description="engine steps per switchback block")
    confidence: float = Field(0.995, ge=0.5, lt=1.0,
                              description="two-sided confidence of a verdict, over all of a trial's looks together")
    min_samples: int = Field(20, ge=3, le=10_000,
                             description="block pairs before the first look, and between two looks")
    max_blocks: int = Field(260, ge=6, le=100_000,
                            description="blocks (both arms) after which an undecided trial ends inconclusive")
    margin: float = Field(0.03, gt=0.0, le=1.0, description=(
        "an interval within keep_gain x [1 / (1 + margin), 1 + margin] means no difference: the trial stops and "
        "the incumbent stays"))
    futility_confidence: float | None = Field(None, ge=0.5, lt=1.0, description=(
        "stop a trial at a look that is not the last, incumbent kept (outcome futile), when 'candidate / incumbent >= "
        "keep_gain' is rejected at this one-sided confidence: a candidate unlikely to clear the bar frees the trial "
        "slot. It only ever keeps the incumbent, so a kept candidate's error rate stays within confidence; unset: "
        "no such stop"))

    @field_validator("max_blocks")
    @classmethod
    def _room_for_a_look(cls, max_blocks: int, info: ValidationInfo) -> int:
        min_samples = info.data.get("min_samples")
        if min_samples is not None and max_blocks < 2 * min_samples:
            raise ValueError(f"must be >= 2 * min_samples ({2 * min_samples}): a trial needs room for one look")
        return max_blocks


class CapacityPolicy(_Section):
    min_factor: float = Field(1.0, gt=0.0, le=16.0)
    max_factor: float = Field(4.0, gt=0.0, le=16.0)
    step: float = Field(0.25, gt=0.0, le=4.0)
    max_drop_rate: float = Field(0.01, ge=0.0, le=1.0, description="dropped / routed tokens above this raises cf")
    max_padding_waste: float = Field(0.5, ge=0.0, le=1.0, description="unused capacity share above this lowers cf")

    @model_validator(mode="after")
    def _bounds(self) -> CapacityPolicy:
        if self.min_factor > self.max_factor:
            raise ValueError(f"min_factor ({self.min_factor}) must be <= max_factor ({self.max_factor})")
        return self


class PlacementPolicy(_Section):
    rebalance_below: float = Field(0.8, gt=0.0, le=1.0, description="re-place experts when balancedness drops below")
    cooldown_windows: int = Field(20, ge=0, description="windows between two re-placements")
    migration_stall_seconds: float = Field(1.0, ge=0.0, description="serving pause one re-placement costs")
    payback_windows: int = Field(10, ge=1, description="windows over which a re-placement must earn its stall back")
    heat_shift: float = Field(0.15, gt=0.0, le=1.0, description=(
        "after a re-placement trial that did not keep its placement, the share of routed tokens that must have moved "
        "to other experts (total variation distance of the expert heat, mean over layers) before the next one"))


class IntRange(_Section):
    low: int = Field(ge=0)
    high: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class FloatRange(_Section):
    low: float = Field(ge=0.0)
    high: float = Field(ge=0.0)

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self


class SearchSpace(_Section):
    spec_method: tuple[SpecMethod, ...] = Field(("draft_model", "ngram", "off"), min_length=1,
                                                description="drafters a trial may choose among")
    draft_len: IntRange = Field(IntRange(low=0, high=8), description="k each batch band may take")
    batch_bands: tuple[int, ...] = Field((), max_length=8, description=(
        "up_to_batch_size edges of the k schedule, e.g. [1, 4, 16]: one k per band and one beyond the last; "
        "empty: one k (draft_len) for every batch size"))
    capacity_factor: FloatRange | None = Field(None, description="searched on MoE targets only")

    @field_validator("draft_len")
    @classmethod
    def _k_in_range(cls, draft_len: IntRange) -> IntRange:
        if draft_len.high > MAX_DRAFT_LEN:
            raise ValueError(f"high must be <= {MAX_DRAFT_LEN}")
        return draft_len

    @field_validator("spec_method")
    @classmethod
    def _distinct(cls, methods: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(methods)) != len(methods):
            raise ValueError("each method at most once")
        return methods

    @field_validator("batch_bands")
    @classmethod
    def _increasing(cls, edges: tuple[int, ...]) -> tuple[int, ...]:
        if any(edge < 1 for edge in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError("must be >= 1 and strictly increasing")
        return edges


class OptunaPolicy(_Section):
    study_name: str = Field("governor", min_length=1, max_length=128)
    budget_trials: int = Field(30, ge=1, le=10_000, description="trials before the search stops and keeps the best")
    sampler: Literal["tpe", "gp", "random"] = "tpe"
    seed: int | None = Field(0, ge=0)
    search_space: SearchSpace = SearchSpace()


class AlertPolicy(_Section):
    overrides: dict[str, AlertAction] = Field(default_factory=dict,
                                              description="alert name -> action, overriding its governor_action label")
    default_action: AlertAction = Field("notify", description="action for an alert without a governor_action label")


class Policy(_Section):
    kind: Literal["rules", "optuna"] = "rules"
    window: WindowPolicy = WindowPolicy()
    slo: SLOPolicy = SLOPolicy()
    speculation: SpeculationPolicy = SpeculationPolicy()
    trial: TrialPolicy = TrialPolicy()
    judge: JudgePolicy = JudgePolicy()
    capacity: CapacityPolicy = CapacityPolicy()
    placement: PlacementPolicy = PlacementPolicy()
    optuna: OptunaPolicy = OptunaPolicy()
    alerts: AlertPolicy = AlertPolicy()


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the file, the field and what is allowed."""

    def __init__(self, source: str, field: str, message: str):
        super().__init__(f"{source}: {field}: {message}")
        self.source, self.field = source, field


def parse_policy(data: object, source: str = "<policy>") -> Policy:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(source, "(top level)", f"must be a mapping of sections, got {type(data).__name__}")
    try:
        return Policy.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        loc = tuple(first["loc"])
        raise PolicyError(source, ".".join(map(str, loc)) or "(top level)",
                          f"{first['msg']}{_allowed(loc, first['type'])}") from None


def load_policy(path: str | Path) -> Policy:
    """Read a YAML policy; a shipped policy may be named without its folder (e.g. 'default')."""
    path = resolve_policy_path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise PolicyError(str(path), "(file)", error.strerror or str(error)) from None
    except yaml.YAMLError as error:
        raise PolicyError(str(path), "(file)", f"not valid YAML: {error}") from None
    return parse_policy(data, str(path))


def resolve_policy_path(path: str | Path) -> Path:
    path = Path(path)
    shipped = SHIPPED / f"{path}.yaml"
    return shipped if not path.exists() and path.suffix == "" and shipped.exists() else path


def shipped_policies() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def _allowed(loc: tuple, kind: str) -> str:
    """' (allowed: ...)' for the field at loc: its range, its choices or the section's field names."""
    model, field = Policy, None
    for part in loc:
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            if kind == "extra_forbidden":
                return f" (allowed fields: {', '.join(fields)})"
            break
        field = fields[part]
        model = _model_of(field.annotation)
    if field is None:
        return ""
    symbols = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    bounds = [f"{symbol} {getattr(m, name)}" for m in field.metadata for name, symbol in symbols.items()
              if getattr(m, name, None) is not None]
    return f" (allowed: {', '.join(bounds)})" if bounds and kind != "literal_error" else ""


def _model_of(annotation: object) -> object:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None
