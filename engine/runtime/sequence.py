"""One request's state as it moves through the engine."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from seam import SamplingParams


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.perf_counter)
    tokens: list[int] = field(init=False)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0          # leading tokens whose target K/V is cached
    draft_computed: int = 0        # leading tokens whose draft K/V is cached
    shadow_at: int = 0             # where prompt lookup drafts next in the shadow of the decoding in use (0: afresh)
    text: str = ""                 # detokenized output, cut at a stop string
    emitted_chars: int = 0
    finish_reason: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    generator: torch.Generator | None = field(init=False)

    def __post_init__(self):
        self.tokens = list(self.prompt_ids)
        if self.params.greedy:
            self.generator = None
        else:
            self.generator = torch.Generator()
            if self.params.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(self.params.seed)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def in_prefill(self) -> bool:
        """True until every token but the last (the one the next step feeds) has its K/V cached."""
        return self.num_computed < len(self.tokens) - 1

    def preempt(self) -> None:
        self.num_computed = self.draft_computed = 0
