"""Traffic phases: what to send, how fast, for how long. Read from a small YAML file and validated."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from governor.loadgen.prompts import DEFAULT_MAX_BYTES

DEMO_FILE = Path(__file__).with_name("demo.yaml")


class PhaseFileError(ValueError):
    pass


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    duration_s: float = Field(gt=0)
    qps: float = Field(gt=0)
    arrival: Literal["poisson", "burst", "constant"] = "poisson"
    burst_size: int = Field(8, ge=1)
    prompts: Literal["code", "prose", "chat"] = "code"
    prompt_bytes: int = Field(DEFAULT_MAX_BYTES, ge=32)
    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(64, ge=1)


class PhasePlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    phases: list[Phase] = Field(min_length=1)

    @field_validator("phases")
    @classmethod
    def _unique_names(cls, phases: list[Phase]) -> list[Phase]:
        names = [p.name for p in phases]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"phase names must be unique, repeated: {', '.join(repeated)}")
        return phases


def load_phases(path: str | Path = DEMO_FILE) -> list[Phase]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise PhaseFileError(f"{path}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise PhaseFileError(f"{path}: not valid YAML: {e}") from e
    return parse_phases(data, source=str(path))


def parse_phases(data: object, source: str = "phases") -> list[Phase]:
    try:
        return PhasePlan.model_validate(data).phases
    except ValidationError as e:
        problems = "; ".join(f"{_location(err['loc'])}: {_message(err)}" for err in e.errors())
        raise PhaseFileError(f"{source}: {problems}") from None


def _location(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "(top level)"


def _message(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        model = Phase if len(err["loc"]) > 1 else PhasePlan
        return f"unknown field; allowed fields: {', '.join(model.model_fields)}"
    if err["type"] == "model_type":
        return "expected a mapping with a 'phases' list" if not err["loc"] else "expected a mapping of phase fields"
    if err["type"] == "missing":
        return "required field is missing"
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    return f"{err['msg']} (got {err['input']!r})"
