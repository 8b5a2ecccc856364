"""The seam between engine and controller: the knobs (EngineConfig), per-request SamplingParams, and what the
engine measured (Window, LatencySummary). Value types only; nothing here imports the project."""
from seam.config import MAX_DRAFT_LEN, EngineConfig, SamplingParams, SpecMethod
from seam.window import LatencySummary, Window

__all__ = ["MAX_DRAFT_LEN", "EngineConfig", "LatencySummary", "SamplingParams", "SpecMethod", "Window"]
