"""Open-loop load: each request leaves at its arrival time whatever the server is doing, streamed and timed per chunk."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import httpx
import numpy as np

from governor.loadgen import arrivals
from governor.loadgen.phases import Phase
from governor.loadgen.prompts import Prompt, prompt_set

StopEvent = threading.Event | asyncio.Event
PROMPT_POOL = 256


class LoadError(RuntimeError):
    pass


@dataclass
class Record:
    phase: str
    kind: str
    arrival_s: float
    sent_s: float | None = None
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.sent_s is not None and self.e2e_s is not None


@dataclass
class PhaseSummary:
    name: str
    started_s: float
    ended_s: float
    requests: int
    completed: int
    errors: int
    dropped: int
    output_tokens: int
    tokens_per_s: float
    requests_per_s: float
    send_lag_max_s: float | None
    ttft_s: dict[str, float] | None
    itl_s: dict[str, float] | None
    e2e_s: dict[str, float] | None


@dataclass
class LoadResult:
    base_url: str
    model: str
    seed: int
    started_at: float
    phases: list[PhaseSummary]
    records: list[Record]

    def to_dict(self) -> dict:
        return asdict(self)

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))


async def run_phases(
    base_url: str,
    phases: Sequence[Phase],
    *,
    model: str | None = None,
    seed: int = 0,
    max_concurrency: int = 256,
    request_timeout_s: float = 300.0,
    drain_timeout_s: float = 60.0,
    progress: bool = True,
    stop: StopEvent | None = None,
) -> LoadResult:
    """Send the phases back to back on the clock, then wait up to drain_timeout_s for requests still in flight."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    async with _client(base_url, max_concurrency, request_timeout_s) as client:
        model = model or await _first_model(client)
        plans = await asyncio.to_thread(_plan, phases, seed)
        run = _Run(client, model, max_concurrency, stop or asyncio.Event())
        reporter = asyncio.create_task(run.report()) if progress else None
        windows, start = [], 0.0
        try:
            for phase, offsets, pool in plans:
                ended = await run.phase(phase, offsets, pool, start)
                windows.append((phase.name, start, ended))
                start += phase.duration_s
                if run.stopped():
                    break
            await run.drain(drain_timeout_s)
        finally:
            await run.drain(0)
            if reporter:
                reporter.cancel()
    if progress:
        run.print_status("finished")
    return LoadResult(
        base_url=base_url,
        model=model,
        seed=seed,
        started_at=run.started_at,
        phases=[_summarize(name, run.records, begin, end) for name, begin, end in windows],
        records=run.records,
    )


async def loop_forever(
    base_url: str,
    phases: Sequence[Phase],
    stop: StopEvent,
    *,
    model: str | None = None,
    seed: int = 0,
    max_concurrency: int = 64,
    on_cycle: Callable[[LoadResult], None] | None = None,
    retry_s: float = 2.0,
) -> None:
    """Repeat the phases until stop is set; while the server is not answering yet, retry every retry_s."""
    cycle = 0
    while not stop.is_set():
        try:
            result = await run_phases(
                base_url, phases, model=model, seed=seed + cycle, max_concurrency=max_concurrency,
                drain_timeout_s=30.0, progress=False, stop=stop,
            )
        except LoadError:
            await _sleep_until_stopped(time.perf_counter() + retry_s, stop)
            continue
        if on_cycle:
            on_cycle(result)
        cycle += 1


def run_forever(base_url: str, phases: Sequence[Phase], stop: threading.Event, **options) -> None:
    """Blocking form of loop_forever with its own event loop, for a demo-traffic thread."""
    asyncio.run(loop_forever(base_url, phases, stop, **options))


async def _first_model(client: httpx.AsyncClient) -> str:
    url = f"{str(client.base_url).rstrip('/')}/v1/models"
    try:
        response = await client.get("/v1/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except httpx.HTTPError as e:
        raise LoadError(f"cannot list models at {url}: {e}") from e
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise LoadError(f"{url} did not answer with an OpenAI model list holding at least one model") from e


class _Run:
    def __init__(self, client: httpx.AsyncClient, model: str, max_concurrency: int, stop: StopEvent):
        self.client = client
        self.model = model
        self.max_concurrency = max_concurrency
        self.stop = stop
        self.started_at = time.time()
        self.t0 = time.perf_counter()
        self.records: list[Record] = []
        self.in_flight: set[asyncio.Task] = set()
        self.tokens = 0
        self.current = ""

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def stopped(self) -> bool:
        return self.stop.is_set()

    async def phase(self, phase: Phase, offsets: list[float], pool: list[Prompt], start: float) -> float:
        self.current = phase.name
        for i, offset in enumerate(offsets):
            if not await _sleep_until_stopped(self.t0 + start + offset, self.stop):
                return self.now()
            record = Record(phase.name, phase.prompts, start + offset)
            self.records.append(record)
            if len(self.in_flight) >= self.max_concurrency:
                record.error = f"dropped: {self.max_concurrency} requests already in flight"
                continue
            task = asyncio.create_task(self.request(record, pool[i % len(pool)], phase))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)
        await _sleep_until_stopped(self.t0 + start + phase.duration_s, self.stop)
        return self.now()

    async def request(self, record: Record, prompt: Prompt, phase: Phase) -> None:
        body = {
            "model": self.model,
            **prompt.body(),
            "max_tokens": phase.max_tokens,
            "temperature": phase.temperature,
            "top_p": phase.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        record.sent_s = self.now()
        try:
            async with self.client.stream("POST", prompt.endpoint, json=body) as response:
                record.status = response.status_code
                if response.status_code != 200:
                    record.error = _error_text(await response.aread())
                else:
                    await self.read_stream(response, record, chat=bool(prompt.messages))
        except asyncio.CancelledError:
            record.error = "cancelled: still in flight when the run ended"
            raise
        except httpx.HTTPError as e:
            record.error = f"{type(e).__name__}: {e}".rstrip(": ")
        finally:
            record.e2e_s = self.now() - record.sent_s

    async def read_stream(self, response: httpx.Response, record: Record, chat: bool) -> None:
        chunks, last, usage_tokens = 0, None, None
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                event = json.loads(data)
            except ValueError:
                record.error = f"not JSON in stream: {data[:80]!r}"
                return
            if "error" in event:
                record.error = _error_text(event)
                return
            for choice in event.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if text:
                    now = self.now()
                    if last is None:
                        record.ttft_s = now - record.sent_s
                    else:
                        record.itl_s.append(now - last)
                    last, chunks = now, chunks + 1
                    self.tokens += 1
                record.finish_reason = choice.get("finish_reason") or record.finish_reason
            if (event.get("usage") or {}).get("completion_tokens") is not None:
                usage_tokens = int(event["usage"]["completion_tokens"])
        record.output_tokens = chunks if usage_tokens is None else usage_tokens
        self.tokens += record.output_tokens - chunks

    async def drain(self, timeout_s: float) -> None:
        deadline = time.perf_counter() + timeout_s
        while self.in_flight and time.perf_counter() < deadline and not self.stopped():
            await asyncio.wait(set(self.in_flight), timeout=min(0.1, max(0.0, deadline - time.perf_counter())))
        pending = set(self.in_flight)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def report(self, interval_s: float = 1.0) -> None:
        tokens, t = self.tokens, time.perf_counter()
        while True:
            await asyncio.sleep(interval_s)
            now = time.perf_counter()
            self.print_status(self.current, (self.tokens - tokens) / (now - t))
            tokens, t = self.tokens, now

    def print_status(self, label: str, tokens_per_s: float | None = None) -> None:
        sent = sum(r.sent_s is not None for r in self.records)
        done = sum(r.ok for r in self.records)
        errors = sum(r.error is not None for r in self.records)
        rate = "" if tokens_per_s is None else f"  tok/s {tokens_per_s:7.1f}"
        print(
            f"load {label:<16} t {self.now():6.1f}s  sent {sent}  done {done}  errors {errors}"
            f"  in-flight {len(self.in_flight)}{rate}",
            file=sys.stderr, flush=True,
        )


def _client(base_url: str, max_concurrency: int, timeout_s: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        timeout=httpx.Timeout(timeout_s, connect=10.0),
        limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        trust_env=False,
    )


async def _sleep_until_stopped(deadline: float, stop: StopEvent) -> bool:
    """Sleep until the perf_counter deadline; False when stop was set first."""
    while not stop.is_set():
        delay = deadline - time.perf_counter()
        if delay <= 0:
            return True
        await asyncio.sleep(min(delay, 0.1))
    return False


def _plan(phases: Sequence[Phase], seed: int) -> list[tuple[Phase, list[float], list[Prompt]]]:
    plans = []
    for index, phase in enumerate(phases):
        phase_seed = zlib.crc32(f"{seed}/{index}".encode())
        offsets = arrivals.offsets(phase.arrival, phase.qps, phase.duration_s, phase_seed, phase.burst_size)
        pool = prompt_set(phase.prompts, max(1, min(len(offsets), PROMPT_POOL)), phase_seed, phase.prompt_bytes)
        plans.append((phase, offsets, pool))
    return plans


def _error_text(payload: bytes | dict) -> str:
    if isinstance(payload, bytes):
        try:
            payload = json.loads(payload)
        except ValueError:
            return payload.decode(errors="replace")[:200] or "empty error body"
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload))
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:200]
        return json.dumps(error)[:200]
    return str(payload)[:200]


def _summarize(name: str, records: list[Record], started_s: float, ended_s: float) -> PhaseSummary:
    mine = [r for r in records if r.phase == name]
    ok = [r for r in mine if r.ok]
    dropped = sum(r.sent_s is None for r in mine)
    finished = [r.sent_s + r.e2e_s for r in mine if r.sent_s is not None and r.e2e_s is not None]
    span = max([ended_s, *finished]) - started_s
    tokens = sum(r.output_tokens for r in mine)
    return PhaseSummary(
        name=name,
        started_s=started_s,
        ended_s=ended_s,
        requests=len(mine),
        completed=len(ok),
        errors=len(mine) - len(ok) - dropped,
        dropped=dropped,
        output_tokens=tokens,
        tokens_per_s=tokens / span if span > 0 else 0.0,
        requests_per_s=len(ok) / span if span > 0 else 0.0,
        send_lag_max_s=max((r.sent_s - r.arrival_s for r in mine if r.sent_s is not None), default=None),
        ttft_s=_percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_s=_percentiles([gap for r in ok for gap in r.itl_s]),
        e2e_s=_percentiles([r.e2e_s for r in ok]),
    )


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99)}
