"""`governor bench soak`: N clients (half streaming, half not) for D minutes against a real `governor serve` on
loopback, half of them leaving early on purpose. Reports errors other than those departures, TTFT and inter-token
p50/p99 with 95% CIs of the means, the server's RSS every 10 s and its growth after warm-up, and KV blocks still
in use once the clients stop. Writes soak.json and soak.png."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import numpy as np

from governor.bench import report
from governor.bench.served import ServedProcess
from governor.bench.streaming import Request, distribution, stream_request, whole_request
from engine.loadgen.prompts import prompt_set
from governor.registry import DEFAULT_MODEL

KV_IDLE_TIMEOUT = 30.0


NAME = "soak"
HELP = ("N streaming and non-streaming clients for D minutes, half leaving early: errors, latency, RSS, "
        "KV blocks left")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model to serve (default {DEFAULT_MODEL})")
    parser.add_argument("--ep", type=report.int_in(1, 64), default=1, help="expert-parallel ranks (default 1)")
    parser.add_argument("--clients", type=report.int_in(2, 4096), default=32, help="concurrent clients (default 32)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the clients run (default 10)")
    parser.add_argument("--max-tokens", type=report.int_in(1, 100_000), default=64,
                        help="tokens per request (default 64)")
    parser.add_argument("--rss-every", type=float, default=10.0, help="seconds between RSS samples (default 10)")
    parser.add_argument("--warmup-minutes", type=float, default=5.0,
                        help="RSS growth is measured after this (default 5; half the run if that is shorter)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="folder for soak.json and soak.png")


def run(args: argparse.Namespace) -> int:
    if args.minutes <= 0:
        print("governor bench soak: --minutes must be > 0")
        return 2
    report.progress(f"soak: starting governor serve --model {args.model} --ep {args.ep}")
    with ServedProcess(args.model, args.ep) as server:
        rss: list[tuple[float, int]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=_sample_rss, args=(server, args.rss_every, rss, stop), daemon=True)
        started = time.monotonic()
        sampler.start()
        requests = asyncio.run(_clients(server.url, args, started))
        stop.set()
        sampler.join()
        kv_in_use = _kv_blocks_after_idle(server)
        rss.append((time.monotonic() - started, server.rss_bytes()))
    result = _summary(args, requests, rss, kv_in_use)
    result["command"] = report.command("governor bench soak", args)
    result["machine"] = report.machine()
    report.write_json(args.out / "soak.json", result)
    report.save_figure(_figure(requests, rss), args.out / "soak.png")
    print(json.dumps({key: result[key] for key in ("requests", "errors", "ttft_s", "inter_token_s", "rss",
                                                   "kv_blocks_in_use_after")}, indent=1))
    report.progress(f"soak: wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    return 0


def _sample_rss(server: ServedProcess, every: float, samples: list, stop: threading.Event) -> None:
    started = time.monotonic()
    while True:
        samples.append((time.monotonic() - started, server.rss_bytes()))
        report.progress(f"soak: t={samples[-1][0]:6.0f} s  RSS {samples[-1][1] / 2**20:7.1f} MiB")
        if stop.wait(every):
            return


async def _clients(url: str, args: argparse.Namespace, started: float) -> list[Request]:
    deadline = started + args.minutes * 60
    prompts = prompt_set("code", 64, seed=args.seed, max_bytes=200) + prompt_set("chat", 64, seed=args.seed,
                                                                                   max_bytes=200)
    records: list[Request] = []
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(300, connect=10), limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await asyncio.gather(*(_client(client, i, model, args, prompts, deadline, started, records)
                               for i in range(args.clients)))
    return records


async def _client(client: httpx.AsyncClient, index: int, model: str, args, prompts, deadline: float,
                  started: float, records: list[Request]) -> None:
    """Client `index` streams when even; clients 2, 3, 6, 7, ... (half of each kind) leave each request early."""
    rng = random.Random(args.seed * 100_003 + index)
    streaming, leaves_early = index % 2 == 0, index % 4 >= 2
    while time.monotonic() < deadline:
        prompt = rng.choice(prompts)
        body = {"model": model, **prompt.body(), "max_tokens": args.max_tokens, "temperature": 0.8,
                "ignore_eos": True, "stream": streaming}
        record = Request(index, streaming, leaves_early, time.monotonic() - started)
        records.append(record)
        sent = time.perf_counter()
        try:
            if streaming:
                await stream_request(client, prompt.endpoint, body, record, sent, rng.randint(1, 8) if leaves_early else None)
            elif leaves_early:
                await asyncio.wait_for(whole_request(client, prompt.endpoint, body, record), timeout=rng.uniform(0.05, 1.0))
            else:
                await whole_request(client, prompt.endpoint, body, record)
        except asyncio.TimeoutError:
            record.outcome = "left"
        except httpx.HTTPError as error:
            record.outcome, record.error = "error", f"{type(error).__name__}: {error}"
        record.e2e_s = time.perf_counter() - sent


def _kv_blocks_after_idle(server: ServedProcess) -> float:
    """KV blocks in use once no client is left (up to KV_IDLE_TIMEOUT for cancelled requests to be reaped)."""
    deadline = time.monotonic() + KV_IDLE_TIMEOUT
    while True:
        in_use = server.metric("governor_kv_blocks_in_use")
        if in_use == 0 or time.monotonic() > deadline:
            return in_use
        time.sleep(0.5)


def _summary(args, requests: list[Request], rss: list[tuple[float, int]], kv_in_use: float) -> dict:
    streamed = [r for r in requests if r.streaming and r.ttft_s is not None]
    warmup = min(args.warmup_minutes * 60, args.minutes * 30)
    after = [bytes_ for t, bytes_ in rss if t >= warmup]
    errors = [r for r in requests if r.outcome == "error"]
    return {
        "settings": {"clients": args.clients, "minutes": args.minutes, "max_tokens": args.max_tokens,
                     "model": args.model, "ep": args.ep, "rss_every_s": args.rss_every, "warmup_s": warmup},
        "requests": {"sent": len(requests), "completed": sum(r.outcome == "ok" for r in requests),
                     "left_early": sum(r.outcome == "left" for r in requests), "errors": len(errors),
                     "streaming": sum(r.streaming for r in requests)},
        "errors": sorted({r.error for r in errors})[:20],
        "ttft_s": distribution([r.ttft_s for r in streamed]),
        "inter_token_s": distribution([gap for r in streamed for gap in r.itl_s]),
        "rss": {"samples": [[round(t, 1), b] for t, b in rss],
                "growth_after_warmup_ratio": (after[-1] - after[0]) / after[0] if len(after) >= 2 else None},
        "kv_blocks_in_use_after": kv_in_use,
        "records": [asdict(r) for r in requests],
    }


def _figure(requests: list[Request], rss: list[tuple[float, int]]):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4))
    memory, latency, outcomes = figure.subplots(1, 3)
    memory.plot([t / 60 for t, _ in rss], [b / 2**20 for _, b in rss], marker="o")
    memory.set(title="server RSS", xlabel="minutes", ylabel="MiB")
    streamed = [r for r in requests if r.ttft_s is not None]
    latency.scatter([r.started_s / 60 for r in streamed], [r.ttft_s for r in streamed], s=4, label="TTFT")
    latency.scatter([r.started_s / 60 for r in streamed if r.itl_s], [np.percentile(r.itl_s, 99) for r in streamed
                                                                       if r.itl_s], s=4, label="p99 inter-token")
    latency.set(title="streaming requests", xlabel="minutes (request start)", ylabel="seconds", yscale="log")
    latency.legend()
    width = max(10.0, max((r.started_s for r in requests), default=0) / 30)       # seconds per bin
    bins = [int(r.started_s // width) for r in requests]
    for outcome, colour in (("ok", "tab:green"), ("left", "tab:orange"), ("error", "tab:red")):
        counts = np.bincount([b for b, r in zip(bins, requests) if r.outcome == outcome],
                             minlength=max(bins, default=0) + 1)
        outcomes.plot(np.arange(len(counts)) * width / 60, counts, marker=".", color=colour, label=outcome)
    outcomes.set(title=f"requests started per {width:.0f} s", xlabel="minutes", ylabel="requests")
    outcomes.legend()
    figure.tight_layout()
    return figure
