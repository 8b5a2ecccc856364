"""The workload of `governor bench controller`: phases whose best config differs, served by closed-loop clients.

- copy: edit/summarise-like requests whose answers repeat long spans of the prompt (a code snippet of up to
  COPY_SNIPPET_BYTES given twice, then its start again: a model that copies, as SmolLM2 does, continues it; answers
  COPY_LENGTH times as long as the others), at concurrency 1; prompt lookup at a large k wins here;
- code: code generation at low concurrency (2); a small k, the draft model where one is trained, or plain decoding;
- mixed: all three kinds at concurrency 6, every answer of the base length: copy answers as long as the copy
  phase's would run on into prose-hot (6 mixed requests in flight at its start, copy answers of up to 288 tokens),
  and there they delivered a third of its tokens (10-14 tok/s of 33-45) and favoured speculation (prompt lookup at
  k 2 served prose-hot's own requests 0.79x plain decoding, the phase as a whole 0.92x);
- prose-hot: prose sampled at PROSE_TEMPERATURE and concurrency 16, where most drafts are rejected and verifying
  them costs a whole batch; plain decoding wins. Its answers are PROSE_LENGTH times as long as the others, so that
  decoding rather than the 16 prefills at its start fills the phase. It comes last: requests still in flight at a
  phase's end finish in the next, and 16 of them would swell the mixed phase's goodput by as much under every config.

Phase lengths are shares of --phase-seconds (PHASE_SHARES, mean 1): copy and prose-hot one and a half of it, code
and mixed half. Copy and prose-hot need opposite configs (k 8 at 2.3-2.5x plain in copy, at 0.67-0.73x in
prose-hot); in code and mixed the configs lie within the noise of each other, and their best flipped from one
repetition to the next (run 8's three: code k 2, k 8, plain; mixed k 8, k 2, k 8). At equal lengths the per-phase
oracle was 1.15x and 1.14x the best static config, at the bar a workload that tests adaptation must clear; with
prose-hot alone lengthened (1, 1, 0.5, 1.5), a compromise (k 2, near plain in prose-hot) became the best static
config and the oracle 1.13x; at these lengths two full runs measured 1.13x and 1.15x, and with mixed's answers at
the base length (k 2 then 0.81-0.86x plain in prose-hot) 1.20x and 1.22x.

In that order, load rises from 1 to 16 sequences. Measured on 2 cores before this order and length (one run of each
static arm through the four 20 s phases, k 8 vs plain): with prose-hot third and as long as the others, 0.72x in
prose-hot, and the per-phase oracle 1.07-1.12x the best static config in three full runs; with prose-hot last and
twice as long, 0.63x, and 1.16x (then in two full runs: 0.68x and 0.67x, the oracle 1.15x and 1.14x).

Closed loop: each phase keeps `concurrency` requests in flight (a finished one is replaced at once), so goodput
measures the service, not the arrival rate. One thread drives the engine as EngineService does (add, step), so the
controller's apply and snapshot reach it between steps exactly as in production.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from engine.engine import Engine
from governor.loadgen import prompt_set
from seam import SamplingParams

COPY, CODE, PROSE, MIXED = "copy", "code", "prose-hot", "mixed"
LOW_ACCEPTANCE_PHASE = PROSE
LENGTHS = (0.5, 1.25, 0.75, 1.5, 1.0)      # of --max-tokens, request by request
COPY_SNIPPET_BYTES = 400
COPY_LENGTH = 4           # less of the phase goes to prefill, the same under every config (k 8 vs plain, 15 s
                          # probes: 2.6x at 2, 2.7x at 4; 2.0x in a 20 s phase of the bench at 2)
PROSE_LENGTH = 2
PHASE_SHARES = {COPY: 1.5, CODE: 0.5, MIXED: 0.5, PROSE: 1.5}
PROSE_TEMPERATURE = 1.0    # at 1.5 prompt lookup rarely finds a match to draft, so k costs little (k = 8: 0.93x plain)


@dataclass(frozen=True)
class Job:
    kind: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    concurrency: int
    seconds: float
    jobs: tuple[Job, ...]


@dataclass
class RequestRecord:
    phase: str
    kind: str
    sent: float                          # seconds since the run started
    finished: float | None = None
    tokens: int = 0
    failed: bool = False
    deliveries: list[tuple[float, int]] = field(default_factory=list)   # (seconds since the start, new tokens)

    @property
    def first_token(self) -> float | None:
        return self.deliveries[0][0] if self.deliveries else None

    def good(self, ttft_bound: float, gap_bound: float) -> bool:
        """Met the SLO over the tokens it delivered: TTFT and mean inter-token gap within their bounds (a request
        still in flight at the end is judged on what it delivered so far)."""
        if self.first_token is None or self.failed:
            return False
        last = self.deliveries[-1][0]
        gap = (last - self.first_token) / (self.tokens - 1) if self.tokens > 1 else 0.0
        return self.first_token - self.sent <= ttft_bound and gap <= gap_bound


@dataclass
class RunResult:
    records: list[RequestRecord] = field(default_factory=list)
    phase_starts: dict[str, float] = field(default_factory=dict)
    started_at: float = 0.0              # time.time() at the start, to place the controller's decisions


def phases(tokenizer, seconds: float, max_tokens: int, seed: int = 0) -> list[PhaseSpec]:
    """The four phases, seconds x PHASE_SHARES long; each request's max_tokens is max_tokens x one of LENGTHS in
    turn, so that the requests of a closed loop do not all start and finish together."""
    def jobs(kind: str, texts: list[str], temperature: float, length: float = 1.0) -> tuple[Job, ...]:
        return tuple(Job(kind, tuple(tokenizer.encode(text)), SamplingParams(
            max_tokens=max(1, round(max_tokens * length * LENGTHS[i % len(LENGTHS)])), temperature=temperature,
            ignore_eos=True, seed=seed + i if temperature > 0 else None)) for i, text in enumerate(texts))

    copy_texts = [_copy_prompt(p.text) for p in prompt_set("code", 12, seed=seed + 1, max_bytes=COPY_SNIPPET_BYTES)]
    code = jobs(CODE, [p.text for p in prompt_set("code", 12, seed=seed + 2, max_bytes=200)], 0.0)
    prose_texts = [p.text for p in prompt_set("prose", 24, seed=seed + 3, max_bytes=200)]
    copy = jobs(COPY, copy_texts, 0.0, COPY_LENGTH)
    prose = jobs(PROSE, prose_texts, PROSE_TEMPERATURE, PROSE_LENGTH)
    mixed = tuple(job for trio in zip(jobs(COPY, copy_texts, 0.0), code, jobs(PROSE, prose_texts, PROSE_TEMPERATURE))
                  for job in trio)
    return [PhaseSpec(name, concurrency, seconds * PHASE_SHARES[name], jobs) for name, concurrency, jobs in (
        (COPY, 1, copy), (CODE, 2, code), (MIXED, 6, mixed), (PROSE, 16, prose))]


def _copy_prompt(snippet: str) -> str:
    """The snippet twice and the start of a third copy: the answer repeats the prompt."""
    return f"{snippet}\n\n{snippet}\n\n{snippet[:len(snippet) // 3]}"


def run_closed_loop(engine: Engine, specs: list[PhaseSpec]) -> RunResult:
    """Serve each phase for its seconds with its concurrency; requests in flight at a phase's end finish in the
    next phase (their tokens counted in the phase that delivered them), as they would in production; those in flight
    at the end are aborted."""
    result = RunResult(started_at=time.time())
    start = time.perf_counter()
    in_flight: dict[str, RequestRecord] = {}
    ids = itertools.count()
    for spec in specs:
        result.phase_starts[spec.name] = time.perf_counter() - start
        jobs = itertools.cycle(spec.jobs)
        deadline = time.perf_counter() + spec.seconds
        while time.perf_counter() < deadline:
            while sum(r.phase == spec.name for r in in_flight.values()) < spec.concurrency:
                job = next(jobs)
                request_id = f"r{next(ids)}"
                engine.add_request(request_id, list(job.prompt_ids), job.params)
                record = RequestRecord(spec.name, job.kind, time.perf_counter() - start)
                in_flight[request_id] = record
                result.records.append(record)
            _step(engine, in_flight, start)
    for request_id in list(in_flight):        # finishing after the last phase, they would count nowhere
        engine.abort(request_id)
    return result


def _step(engine: Engine, in_flight: dict[str, RequestRecord], start: float) -> None:
    emissions = engine.step()
    now = time.perf_counter() - start
    for emission in emissions:
        record = in_flight.get(emission.request_id)
        if record is None:
            continue
        if emission.output_tokens > record.tokens:
            record.deliveries.append((now, emission.output_tokens - record.tokens))
        record.tokens = emission.output_tokens
        if emission.failure is not None:
            record.failed = True
        if emission.finish_reason is not None:
            record.finished = now
            del in_flight[emission.request_id]


def goodput(result: RunResult, specs: list[PhaseSpec], ttft_bound: float, gap_bound: float) -> dict[str, float]:
    """Per phase: output tokens delivered during it by SLO-meeting requests, per second of the phase. Counting
    tokens as they arrive, rather than whole requests when they finish, keeps a phase's figure from moving by a
    whole request's tokens when one finishes just after the phase ends."""
    delivered = good_deliveries(result, ttft_bound, gap_bound)
    out = {}
    for spec in specs:
        begin = result.phase_starts[spec.name]
        end = begin + spec.seconds
        out[spec.name] = sum(n for at, n in delivered if begin <= at < end) / spec.seconds
    return out


def good_deliveries(result: RunResult, ttft_bound: float, gap_bound: float) -> list[tuple[float, int]]:
    """(seconds since the start, tokens) of every delivery by a request that met the SLO."""
    return [d for r in result.records if r.good(ttft_bound, gap_bound) for d in r.deliveries]
