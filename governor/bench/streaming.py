"""Client-side measurements for the serving benchmarks: one request's outcome, TTFT and inter-token gaps, and the
summary statistics the reports print."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx
import numpy as np


@dataclass
class Request:
    client: int
    streaming: bool
    leaves_early: bool
    started_s: float
    status: int | None = None
    outcome: str = "ok"              # ok | left (a deliberate departure) | error
    error: str | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None


async def whole_request(client: httpx.AsyncClient, endpoint: str, body: dict, record: Request) -> None:
    reply = await client.post(endpoint, json=body)
    _check(reply.status_code, reply.text, record)


async def stream_request(client: httpx.AsyncClient, endpoint: str, body: dict, record: Request, sent: float,
                  leave_after: int | None) -> None:
    """leave_after: close the connection after this many content chunks (a deliberate departure)."""
    async with client.stream("POST", endpoint, json=body) as reply:
        if reply.status_code != 200:
            _check(reply.status_code, (await reply.aread()).decode(errors="replace"), record)
            return
        record.status, last, chunks = 200, None, 0
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            if not (choice.get("text") or (choice.get("delta") or {}).get("content")):
                continue
            now = time.perf_counter()
            if last is None:
                record.ttft_s = now - sent
            else:
                record.itl_s.append(now - last)
            last, chunks = now, chunks + 1
            if leave_after is not None and chunks >= leave_after:
                record.outcome = "left"
                return


def _check(status: int, text: str, record: Request) -> None:
    record.status = status
    if status != 200:
        record.outcome, record.error = "error", f"{status}: {text[:200]}"


def distribution(values: list[float]) -> dict | None:
    """p50, p99, and the mean with its 95% confidence interval (normal approximation over the samples)."""
    if not values:
        return None
    data = np.asarray(values)
    half = 1.96 * data.std(ddof=1) / np.sqrt(len(data)) if len(data) > 1 else float("nan")
    return {"n": len(data), "p50": float(np.percentile(data, 50)), "p99": float(np.percentile(data, 99)),
            "mean": float(data.mean()), "mean_ci95": [float(data.mean() - half), float(data.mean() + half)]}
