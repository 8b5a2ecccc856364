"""The seam between engine and controller: the knobs (EngineConfig), a switchback trial of two of them
(Experiment), per-request SamplingParams, and what the engine measured (Window, LatencySummary, Block). Value types only; nothing here imports the project."""
from seam.config import (MAX_DRAFT_LEN, SPEC_METHODS, DraftLenSchedule, EngineConfig, Experiment, SamplingParams,
                         SpecMethod)
from seam.window import Block, LatencySummary, Window, batch_band, decode_cost_terms, median_batch_size

__all__ = ["MAX_DRAFT_LEN", "SPEC_METHODS", "Block", "DraftLenSchedule", "EngineConfig", "Experiment", "LatencySummary", "SamplingParams", "SpecMethod",
           "Window", "batch_band", "decode_cost_terms", "median_batch_size"]
