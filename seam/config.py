"""The seam's knob set (EngineConfig) and per-request sampling parameters."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_DRAFT_LEN = 16
MAX_SCHEDULE_BANDS = 32

SpecMethod = Literal["off", "draft_model", "ngram"]
SPEC_METHODS: tuple[SpecMethod, ...] = ("draft_model", "ngram", "off")
UpToBatchSize = Annotated[int, Field(ge=1, le=1_000_000)]
BandDraftLen = Annotated[int, Field(ge=0, le=MAX_DRAFT_LEN)]
DraftLenSchedule = tuple[tuple[UpToBatchSize, BandDraftLen], ...]


class EngineConfig(BaseModel):
    """Validated, immutable, versioned engine knobs. draft_len 0 (or spec_method 'off') is plain decoding."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(0, ge=0)
    spec_method: SpecMethod = "draft_model"
    draft_len: int = Field(4, ge=0, le=MAX_DRAFT_LEN, description="k at every batch size (without a schedule)")
    draft_len_schedule: DraftLenSchedule | None = Field(None, min_length=1, max_length=MAX_SCHEDULE_BANDS, description=(
        "k by batch size: [[up_to_batch_size, k], ...], up_to_batch_size strictly increasing; a step of b sequences "
        "drafts the k of the first band with b <= up_to_batch_size (beyond the last band, its k); when set it "
        "takes the place of draft_len"))
    ngram_min: int = Field(1, ge=1, le=8, description="shortest suffix n-gram prompt lookup matches")
    ngram_max: int = Field(4, ge=1, le=8, description="longest suffix n-gram prompt lookup tries first")
    capacity_factor: float = Field(0.0, ge=0, le=16, description=(
        "MoE expert capacity = ceil(capacity_factor * tokens * top_k / experts) (token, expert) pairs per step; "
        "pairs over capacity are dropped (governor_kernels.router); 0 = dropless"))
    placement: tuple[tuple[int, ...], ...] | None = Field(None, description=(
        "per MoE layer, the logical expert each physical slot holds (replicas allowed); slot s runs on "
        "expert-parallel rank s // slots_per_device; None = experts in order over the slots"))

    @field_validator("draft_len_schedule")
    @classmethod
    def _increasing(cls, schedule: DraftLenSchedule | None) -> DraftLenSchedule | None:
        if schedule is None:
            return None
        for index, (up_to, _) in enumerate(schedule):
            if index and up_to <= schedule[index - 1][0]:
                raise ValueError(f"band {index}: up_to_batch_size must be strictly increasing "
                                 f"({up_to} after {schedule[index - 1][0]})")
        return schedule

    @model_validator(mode="after")
    def _ngram_range(self) -> EngineConfig:
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")
        return self

    def changed(self, **changes) -> EngineConfig:
        """A validated copy with some fields changed (model_copy would skip validation)."""
        return type(self).model_validate({**self.model_dump(), **changes})

    @property
    def draft_len_bands(self) -> DraftLenSchedule:
        """The schedule in use: draft_len is the one-band case."""
        return self.draft_len_schedule if self.draft_len_schedule is not None else ((1, self.draft_len),)

    def draft_len_for(self, batch_size: int) -> int:
        """The draft_len a step of batch_size sequences drafts: 0 when speculation is off."""
        if self.spec_method == "off":
            return 0
        return next((k for up_to, k in self.draft_len_bands if batch_size <= up_to), self.draft_len_bands[-1][1])

    @property
    def longest_draft_len(self) -> int:
        """The largest draft_len any batch size drafts: 0 when speculation is off (at every batch size)."""
        return 0 if self.spec_method == "off" else max(k for _, k in self.draft_len_bands)


class Experiment(BaseModel):
    """A switchback trial: the engine alternates the two configs in blocks of block_steps engine steps, in ABBA
    order (incumbent, candidate, candidate, incumbent, ...), so both arms see the same traffic."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    incumbent: EngineConfig
    candidate: EngineConfig
    block_steps: int = Field(4, ge=1, le=10_000, description="engine steps per block")


class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: tuple[str, ...] = Field((), max_length=4)
    seed: int | None = Field(None, ge=0, lt=2**63)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
