"""Open-loop load generation against an OpenAI-compatible server: prompts, arrivals, phases, runner."""

from governor.loadgen.arrivals import burst, constant, poisson
from governor.loadgen.phases import DEMO_FILE, Phase, PhaseFileError, load_phases, parse_phases
from governor.loadgen.prompts import Prompt, prompt_set
from governor.loadgen.runner import (
    LoadError,
    LoadResult,
    PhaseSummary,
    Record,
    loop_forever,
    run_forever,
    run_phases,
)

__all__ = [
    "DEMO_FILE",
    "LoadError",
    "LoadResult",
    "Phase",
    "PhaseFileError",
    "PhaseSummary",
    "Prompt",
    "Record",
    "burst",
    "constant",
    "load_phases",
    "loop_forever",
    "parse_phases",
    "poisson",
    "prompt_set",
    "run_forever",
    "run_phases",
]
