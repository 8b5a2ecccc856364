"""Window: what the engine measured between two snapshots. The controller judges configs on these."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class LatencySummary:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, samples: list[float]) -> LatencySummary:
        if not samples:
            return cls(0, None, None, None, None, None)
        values = np.asarray(samples)
        p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
        return cls(len(samples), float(values.mean()), p50, p90, p99, float(values.max()))


@dataclass(frozen=True)
class Block:
    """One switchback block: block_steps engine steps under one arm of an Experiment. Blocks 2j and 2j + 1 (one of
    each arm, adjacent in time) form pair j."""
    index: int
    arm: str                          # "incumbent" | "candidate"
    config_version: int
    steps: int
    emitted_tokens: int
    busy_seconds: float               # engine step seconds
    inter_token_seconds: float | None  # mean inter-token gap of the tokens delivered in the block
    decode_tokens: int = 0            # emitted by the block's steps that ran no prefill
    decode_seconds: float = 0.0       # those steps' seconds
    decode_steps: int = 0             # how many steps those were
    decode_sequences: int = 0         # the sequences they stepped (the sum of their batch sizes)
    sequences: int = 0                # the sequences all its steps stepped, prefills included
    source: str = ""                  # the engine replica it ran on (set when replicas' windows are merged)

    @property
    def tokens_per_busy_second(self) -> float:
        return self.emitted_tokens / self.busy_seconds if self.busy_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """What the judge compares (decode-only steps: a prefill costs the same under any config but swings a block's
        throughput)."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def decode_sequence_steps_per_second(self) -> float:
        """Sequences stepped per second of decode-only steps: throughput without the acceptance of the block's drafts
        (what the judge compares when both arms deliver the same tokens, so acceptance differs only by chance)."""
        return self.decode_sequences / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def batch_size(self) -> float | None:
        """The mean batch size of all its steps (None if not measured): where the load was."""
        return self.sequences / self.steps if self.sequences and self.steps else None

    @property
    def decode_batch_size(self) -> float | None:
        """The mean batch size of the decode-only steps (None if not measured): the judge's covariate."""
        return self.decode_sequences / self.decode_steps if self.decode_steps else None


def decode_cost_terms(batch_size: int, draft_tokens: int, verify_seconds: float, draft_seconds: float) -> list[float]:
    """One decode step's addends to Window.decode_cost_sums; verify_seconds: the step's seconds but its drafter's."""
    b, d, s = float(batch_size), float(draft_tokens), verify_seconds
    z = 1.0 if draft_tokens == 0 else 0.0
    return [1.0, b, d, s, b * b, b * d, d * d, b * s, d * s, s * s, draft_seconds, z, z * b, z * s]


def batch_band(batch_size: float) -> int:
    """The batch sizes that round to 2^band on a log scale: band 0 is 1 sequence, 1 is 2, 2 is 3-5, 3 is 6-11, 4 is
    12-22; the controller learns k per band."""
    return round(math.log2(max(batch_size, 1.0)))


def median_batch_size(steps_per_batch_size: list[int] | None, batch_size_mean: float) -> int:
    """The batch size of the median step, from the steps per batch size ([n]: steps that ran n sequences); the
    rounded mean where those were not counted (at least 1)."""
    if not steps_per_batch_size or not any(steps_per_batch_size):
        return max(1, round(batch_size_mean))
    cumulative = np.cumsum(steps_per_batch_size)
    return max(1, int(np.searchsorted(cumulative, cumulative[-1] / 2)))


@dataclass(frozen=True)
class Window:
    start: float                      # unix seconds
    end: float
    config_version: int
    spec_method: str
    draft_len: int
    steps: int
    num_drafts: int                   # sequence-steps that verified at least one draft token
    drafted_tokens: int
    accepted_tokens: int
    drafted_per_position: list[int]
    accepted_per_position: list[int]
    emitted_tokens: int
    prefill_tokens: int
    finished_requests: int
    target_forward_seconds: float
    draft_forward_seconds: float
    step_seconds: float
    ttft_seconds: LatencySummary
    inter_token_seconds: LatencySummary
    e2e_seconds: LatencySummary
    batch_size_mean: float
    batch_size_max: int
    queue_depth_mean: float
    queue_depth_max: int
    expert_tokens: list[list[int]] | None   # [layers][experts] tokens routed, MoE targets only
    # MoE targets only below (None / 0 otherwise); "tokens" are (token, expert) pairs, top_k per token per layer
    slot_tokens: list[list[int]] | None = None            # [layers][slots] pairs each physical slot computed
    rank_tokens: list[list[int]] | None = None            # [layers][ranks] pairs each rank's experts computed
    dropped_tokens: int = 0                               # pairs dropped over capacity, all layers
    dropped_per_layer: list[int] | None = None            # [layers]
    balancedness: float | None = None                     # vLLM: sum_l mean_r / sum_l max_r of rank_tokens
    balancedness_per_layer: list[float | None] | None = None
    all_to_all_seconds: float = 0.0                       # expert-parallel exchange time inside target forwards
    capacity_factor: float = 0.0                          # echo of the config (0 = dropless)
    replacement_seconds: float = 0.0                      # serving stalled while expert weights moved
    # prompt lookup in the shadow of the decoding in use (engine.speculative.drafters.shadow_lookups): the shadow
    # drafts resolved, and per position what they drafted and what verification would have accepted
    shadow_lookups: int = 0
    shadow_drafted_per_position: list[int] | None = None
    shadow_accepted_per_position: list[int] | None = None
    steps_per_batch_size: list[int] | None = None         # [n]: steps that ran n sequences
    # the steps that ran no prefill (what the judge compares), as the sums a least-squares fit of a step's seconds but
    # its drafter's (the target's forward and verifying: sampling a sequence's tokens costs more as it verifies more)
    # s on its batch size b, the draft tokens d it verified and z = 1 if it verified none needs, and the drafter's
    # seconds: [steps, Σb, Σd, Σs, Σb², Σbd, Σd², Σbs, Σds, Σs², Σdraft seconds, Σz, Σzb, Σzs] (decode_cost_terms)
    decode_cost_sums: list[float] | None = None
    # while an Experiment runs: the blocks completed in this window, and what each arm measured
    blocks: list[Block] | None = None
    arms: dict[str, Window] | None = None
    # per batch band (batch_band of each step's batch size): that band's steps alone, their step figures only (costs,
    # drafts, shadow lookups, batch sizes; no tokens or latencies, which the whole window holds)
    by_band: dict[int, Window] | None = None

    @property
    def duration_seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    @property
    def batch_size_median(self) -> int:
        """The batch size of the window's median step: where its load was. A window that spans a change in load
        has its mean between the two, at batch sizes few of its steps ran (1 copy request left over beside 2 code
        requests ran most steps at 3 sequences in a window of mean 2.4)."""
        return median_batch_size(self.steps_per_batch_size, self.batch_size_mean)

    @property
    def goodput_tokens_per_second(self) -> float:
        return self.emitted_tokens / self.duration_seconds

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def comm_share(self) -> float | None:
        """Share of step time spent in expert-parallel communication."""
        return self.all_to_all_seconds / self.step_seconds if self.step_seconds else None

    def to_dict(self) -> dict:
        return {**asdict(self), "duration_seconds": self.duration_seconds,
                "goodput_tokens_per_second": self.goodput_tokens_per_second, "comm_share": self.comm_share,
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length}
