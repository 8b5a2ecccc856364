"""Windows for controller tests whose steps all decode alike: their decode_cost_sums as the engine would sum them."""
from __future__ import annotations

import dataclasses

from seam import Window, decode_cost_terms


def decoding(window: Window) -> Window:
    """window with decode_cost_sums for its steps, each one decode step of its mean batch size, draft tokens and
    seconds."""
    n = window.steps
    terms = decode_cost_terms(window.batch_size_mean, window.drafted_tokens / n,
                              (window.step_seconds - window.draft_forward_seconds) / n, window.draft_forward_seconds / n)
    return dataclasses.replace(window, decode_cost_sums=[n * term for term in terms])
