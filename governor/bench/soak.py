"""`governor bench soak`: the `make run` config (`governor serve --ep 2`, the controller running its trials; no demo
traffic, whose endless requests would hold KV blocks past the clients) plus N clients (half streaming, half not) for D minutes on loopback, half of them leaving early on purpose.
Reports errors other than those departures, TTFT and inter-token p50/p99 with 95% CIs of the means, every rank's RSS
every 10 s and its growth after warm-up, the answers of every admin and dashboard endpoint polled throughout (any
non-200 or JSON that a strict parser rejects), the controller's decisions, the console errors of the dashboard
page in headless Chromium at the end, and KV blocks still in use once the clients stop. Writes soak.json and
soak.png."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import httpx
import numpy as np

from governor.bench import report
from governor.bench.served import ServedProcess
from governor.bench.streaming import Request, distribution, stream_request, whole_request
from governor.loadgen.prompts import prompt_set
from governor.registry import DEFAULT_MODEL

KV_IDLE_TIMEOUT = 30.0
POLLED = ("/health", "/ready", "/metrics", "/admin/window", "/admin/config", "/admin/controller", "/admin/decisions",
          "/admin/history", "/admin/trials", "/admin/alerts", "/admin/policy", "/dashboard/state")
PAGE_SECONDS = 20.0
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"]


NAME = "soak"
HELP = ("N streaming and non-streaming clients for D minutes, half leaving early: errors, latency, RSS, "
        "KV blocks left")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model to serve (default {DEFAULT_MODEL})")
    parser.add_argument("--ep", type=report.int_in(1, 64), default=2, help="expert-parallel ranks (default 2, as "
                        "`make run` on >= 2 cores)")
    parser.add_argument("--clients", type=report.int_in(2, 4096), default=32, help="concurrent clients (default 32)")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the clients run (default 30)")
    parser.add_argument("--max-tokens", type=report.int_in(1, 100_000), default=64,
                        help="tokens per request (default 64)")
    parser.add_argument("--rss-every", type=float, default=10.0,
                        help="seconds between RSS samples and endpoint polls (default 10)")
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
        rss: list[tuple[float, dict[str, int]]] = []
        polls: list[dict] = []
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(server, args.rss_every, rss, polls, stop), daemon=True)
        started = time.monotonic()
        sampler.start()
        requests = asyncio.run(_clients(server.url, args, started))
        stop.set()
        sampler.join()
        page_errors = _dashboard_console_errors(server.url)
        decisions = httpx.get(f"{server.url}/admin/decisions", params={"limit": 1000}, timeout=30).json()["decisions"]
        kv_in_use = _kv_blocks_after_idle(server)
        rss.append((time.monotonic() - started, server.rank_rss_bytes()))
    result = _summary(args, requests, rss, kv_in_use)
    result["endpoints"] = _endpoint_summary(polls)
    result["decisions"] = {"count": len(decisions), "by_action": dict(Counter(d.get("action") for d in decisions))}
    result["dashboard_console_errors"] = page_errors
    result["command"] = report.command("governor bench soak", args)
    result["machine"] = report.machine()
    report.write_json(args.out / "soak.json", result)
    report.save_figure(_figure(requests, rss), args.out / "soak.png")
    print(json.dumps({key: result[key] for key in ("requests", "errors", "ttft_s", "inter_token_s", "endpoints",
                                                   "decisions", "dashboard_console_errors",
                                                   "kv_blocks_in_use_after")}, indent=1))
    print(json.dumps({rank: data["growth_after_warmup_ratio"] for rank, data in result["rss"].items()}))
    report.progress(f"soak: wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    return 0


def _sample(server: ServedProcess, every: float, rss: list, polls: list, stop: threading.Event) -> None:
    """Every `every` seconds: each rank's RSS, then one GET of every polled endpoint."""
    started = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while True:
            rss.append((time.monotonic() - started, server.rank_rss_bytes()))
            report.progress(f"soak: t={rss[-1][0]:6.0f} s  RSS " + "  ".join(
                f"{rank} {size / 2**20:7.1f} MiB" for rank, size in rss[-1][1].items()))
            polls.extend(_poll(client, path) for path in POLLED)
            if stop.wait(every):
                return


def _poll(client: httpx.Client, path: str) -> dict:
    """One GET: its status, and whether a JSON body parses strictly (NaN and Infinity are not JSON)."""
    try:
        response = client.get(path)
    except httpx.HTTPError as error:
        return {"path": path, "status": None, "problem": f"{type(error).__name__}: {error}"}
    problem = None
    if response.headers.get("content-type", "").startswith("application/json"):
        try:
            json.loads(response.text, parse_constant=_reject_constant)
        except ValueError as error:
            problem = f"not strict JSON: {error}"
    return {"path": path, "status": response.status_code, "problem": problem}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _endpoint_summary(polls: list[dict]) -> dict:
    """Per endpoint: polls, and those that failed (no answer, 5xx, or JSON a strict parser rejects)."""
    failed = [p for p in polls if p["status"] is None or p["status"] >= 500 or p["problem"]]
    return {"polls": len(polls), "failed": len(failed),
            "by_path": {path: dict(Counter(str(p["status"]) for p in polls if p["path"] == path)) for path in POLLED},
            "failures": failed[:20]}


def _dashboard_console_errors(url: str) -> dict:
    """Open the operator page in headless Chromium for PAGE_SECONDS of live events and count its console errors and
    uncaught exceptions (needs the test extra's Playwright and a Chromium binary; says so where either is missing)."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {"count": None, "reason": "playwright is not installed (pip install -e '.[test]')"}
    if chromium is None:
        return {"count": None, "reason": "no chromium binary on PATH"}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="governor-soak-chromium-") as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True,
                                                                args=CHROMIUM_FLAGS)
        page = context.new_page()
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url)
        page.wait_for_timeout(PAGE_SECONDS * 1000)
        context.close()
    return {"count": len(errors), "seconds": PAGE_SECONDS, "errors": errors[:20]}


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


def _summary(args, requests: list[Request], rss: list[tuple[float, dict[str, int]]], kv_in_use: float) -> dict:
    streamed = [r for r in requests if r.streaming and r.ttft_s is not None]
    warmup = min(args.warmup_minutes * 60, args.minutes * 30)
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
        "rss": {rank: _rank_rss(rank, rss, warmup) for rank in rss[0][1]},
        "kv_blocks_in_use_after": kv_in_use,
        "records": [asdict(r) for r in requests],
    }


def _rank_rss(rank: str, rss: list[tuple[float, dict[str, int]]], warmup: float) -> dict:
    """One rank's samples, its RSS at the first sample after warm-up, and the largest rise above that after it."""
    samples = [(t, sizes[rank]) for t, sizes in rss if rank in sizes]
    after = [size for t, size in samples if t >= warmup]
    return {"samples": [[round(t, 1), size] for t, size in samples],
            "after_warmup_bytes": after[0] if after else None,
            "growth_after_warmup_ratio": (max(after) - after[0]) / after[0] if len(after) >= 2 else None}


def _figure(requests: list[Request], rss: list[tuple[float, dict[str, int]]]):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4))
    memory, latency, outcomes = figure.subplots(1, 3)
    for rank in rss[0][1]:
        memory.plot([t / 60 for t, sizes in rss if rank in sizes], [sizes[rank] / 2**20 for _, sizes in rss
                                                                      if rank in sizes], marker="o", label=rank)
    memory.set(title="RSS per rank", xlabel="minutes", ylabel="MiB")
    memory.legend()
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
