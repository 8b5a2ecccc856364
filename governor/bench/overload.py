"""`governor bench overload` against a real `governor serve`, /health probed throughout from a process of its own.

--mode retry (the default): closed-loop streaming clients in three arms of --seconds each, in the order capacity,
overload, capacity: --clients clients, then --factor times as many that retry --retry-ms after each 429 (ignoring
its Retry-After, as impatient clients do), then --clients again. Reports each arm's admitted throughput, the overload
arm's over the mean of the two capacity arms around it, and the admitted requests' TTFT and inter-token p99 beside
the policy's SLO, both as the clients timed them and as the server's own TTFT histogram did (arrival at the engine to
first token: what the client's figure adds is accepting, parsing and the client itself). Writes overload-retry.json
and overload-retry.png.

--mode burst: --requests streaming requests at once: how many are admitted and how many refused (429), any 5xx, and
the admitted requests' latency beside the SLO. Writes overload.json and overload.png."""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from governor.bench import report
from governor.bench.served import ServedProcess
from governor.bench.streaming import Request, distribution, stream_request
from governor.loadgen.prompts import prompt_set
from governor.registry import DEFAULT_MODEL
from policies import load_policy

NAME = "overload"
HELP = "many requests at once: 429s, 5xx, /health latency, admitted requests' latency beside the SLO"
PROBER_START_SECONDS = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("retry", "burst"), default="retry",
                        help="retry: fast-retrying clients past capacity (default); burst: many requests at once")
    parser.add_argument("--clients", type=report.int_in(1, 4096), default=64,
                        help="retry mode: closed-loop clients at capacity (default 64)")
    parser.add_argument("--factor", type=report.int_in(2, 64), default=4,
                        help="retry mode: the overload arm runs this many times --clients (default 4)")
    parser.add_argument("--retry-ms", type=report.int_in(0, 60_000), default=50,
                        help="retry mode: milliseconds a client waits after a 429 (default 50)")
    parser.add_argument("--seconds", type=float, default=45.0, help="retry mode: seconds per arm (default 45)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model to serve (default {DEFAULT_MODEL})")
    parser.add_argument("--ep", type=report.int_in(1, 64), default=1, help="expert-parallel ranks (default 1)")
    parser.add_argument("--requests", type=report.int_in(1, 20_000), default=1000,
                        help="burst mode: requests sent at once (default 1000)")
    parser.add_argument("--max-tokens", type=report.int_in(1, 100_000), default=None,
                        help="tokens per request (default 256 in burst mode, 64 in retry mode)")
    parser.add_argument("--health-every", type=float, default=0.1, help="seconds between /health probes")
    parser.add_argument("--policy", default="default", help="the policy whose SLO the latency is held to")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"),
                        help="folder for overload.json and overload.png")


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0:
        print("governor bench overload: --seconds must be > 0")
        return 2
    slo = load_policy(args.policy).slo
    if args.mode == "retry":
        args.max_tokens = args.max_tokens or 64
        return _run_retry(args, slo)
    args.max_tokens = args.max_tokens or 256
    report.progress(f"overload: starting governor serve --model {args.model} --ep {args.ep}")
    with ServedProcess(args.model, args.ep) as server:
        requests, health = asyncio.run(_overload(server.url, args))
        kv_in_use = server.metric("governor_kv_blocks_in_use")
        limits = {name: server.metric("governor_limit", limit=name)
                  for name in ("max_waiting_requests", "max_waiting_tokens", "max_num_seqs")}
    statuses = Counter(r.status for r in requests)
    admitted = [r for r in requests if r.status == 200]
    itl = distribution([gap for r in admitted for gap in r.itl_s])
    answered = [latency for _, latency in health if latency is not None]
    result = {
        "settings": {"requests": args.requests, "max_tokens": args.max_tokens, "model": args.model, "ep": args.ep,
                     "limits": limits},
        "statuses": {str(status): count for status, count in sorted(statuses.items(), key=str)},
        "server_errors_5xx": sum(count for status, count in statuses.items() if status and status >= 500),
        "transport_errors": sorted({r.error for r in requests if r.status is None})[:10],
        "health_s": {**distribution(answered), "max": max(answered),
                     "failed": sum(latency is None for _, latency in health),
                     "timeline": [[round(t, 3), None if latency is None else round(latency, 4)]
                                  for t, latency in health]},
        "admitted_ttft_s": distribution([r.ttft_s for r in admitted if r.ttft_s is not None]),
        "admitted_inter_token_s": itl,
        "slo": {"inter_token_p99_seconds": slo.inter_token_p99_seconds, "ttft_p99_seconds": slo.ttft_p99_seconds,
                "inter_token_p99_within": None if itl is None or slo.inter_token_p99_seconds is None
                else itl["p99"] <= slo.inter_token_p99_seconds},
        "kv_blocks_in_use_after": kv_in_use,
        "command": report.command("governor bench overload", args),
        "machine": report.machine(),
    }
    report.write_json(args.out / "overload.json", result)
    report.save_figure(_figure(requests, health, slo.inter_token_p99_seconds), args.out / "overload.png")
    print(json.dumps({key: value for key, value in result.items() if key not in ("machine", "command")}, indent=1))
    return 0


ARMS = ("capacity", "overload", "capacity")


def _run_retry(args: argparse.Namespace, slo) -> int:
    report.progress(f"overload: starting governor serve --model {args.model} --ep {args.ep}")
    with ServedProcess(args.model, args.ep) as server:
        arms, health = asyncio.run(_retry_arms(server.url, args))
        limits = {name: server.metric("governor_limit", limit=name)
                  for name in ("max_waiting_requests", "max_waiting_tokens", "max_num_seqs")}
    summaries = [_arm_summary(name, *arm, health=health) for name, arm in zip(ARMS, arms)]
    capacity = np.mean([summaries[0]["admitted_per_s"], summaries[2]["admitted_per_s"]])
    overload = summaries[1]
    itl, ttft = overload["admitted_inter_token_s"], overload["admitted_ttft_s"]
    result = {
        "settings": {"clients": args.clients, "factor": args.factor, "retry_ms": args.retry_ms,
                     "seconds": args.seconds, "max_tokens": args.max_tokens, "model": args.model, "ep": args.ep,
                     "limits": limits},
        "arms": summaries,
        "admitted_throughput_ratio": overload["admitted_per_s"] / capacity if capacity else None,
        "capacity_arms_ratio": (summaries[2]["admitted_per_s"] / summaries[0]["admitted_per_s"]
                                if summaries[0]["admitted_per_s"] else None),
        "slo": {"inter_token_p99_seconds": slo.inter_token_p99_seconds, "ttft_p99_seconds": slo.ttft_p99_seconds,
                "inter_token_p99_within": None if itl is None or slo.inter_token_p99_seconds is None
                else itl["p99"] <= slo.inter_token_p99_seconds,
                "ttft_p99_within": None if ttft is None or slo.ttft_p99_seconds is None
                else ttft["p99"] <= slo.ttft_p99_seconds},
        "command": report.command("governor bench overload", args),
        "machine": report.machine(),
    }
    report.write_json(args.out / "overload-retry.json", result)
    report.save_figure(_retry_figure(summaries, health), args.out / "overload-retry.png")
    print(json.dumps({key: value for key, value in result.items() if key not in ("machine", "command")}, indent=1))
    return 0


async def _retry_arms(url: str, args: argparse.Namespace):
    """Each arm's records, its length in seconds, its (start, end) since the first arm began and the server's TTFT
    histogram over it; /health samples."""
    prompts = prompt_set("code", 128, seed=0, max_bytes=200)
    most = args.clients * args.factor
    limits = httpx.Limits(max_connections=most + 8, max_keepalive_connections=most)
    started = time.monotonic()
    arms = []
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600, connect=60), limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        with HealthProber(url, args.health_every, started) as prober:
            for name in ARMS:
                clients = most if name == "overload" else args.clients
                report.progress(f"overload: {name} arm, {clients} clients for {args.seconds:g} s")
                before = await _ttft_buckets(client)
                begin = time.monotonic()
                deadline = begin + args.seconds
                records: list[Request] = []
                await asyncio.gather(*(_retrying_client(client, model, prompts, i, args, deadline, records)
                                       for i in range(clients)))
                span = (begin - started, time.monotonic() - started)
                after = await _ttft_buckets(client)
                arms.append((records, time.monotonic() - begin, span,
                             {bound: after[bound] - before.get(bound, 0) for bound in after}))
        health = prober.samples
    return arms, health


async def _ttft_buckets(client: httpx.AsyncClient) -> dict[float, float]:
    """The server's own time-to-first-token histogram (arrival at the engine to first token): cumulative count per
    bucket bound, +Inf included."""
    buckets = {}
    for family in text_string_to_metric_families((await client.get("/metrics")).text):
        if family.name == "governor_time_to_first_token_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def _server_ttft(buckets: dict[float, float]) -> dict | None:
    """What the server's histogram says of an arm's first tokens: how many, the bucket bound their p99 lies at or
    under, and the share within each bound."""
    total = buckets.get(math.inf, 0.0)
    if not total:
        return None
    bounds = sorted(buckets)
    return {"n": total, "p99_at_most": next(bound for bound in bounds if buckets[bound] >= 0.99 * total),
            "share_within": {str(bound): buckets[bound] / total for bound in bounds if bound < math.inf}}


async def _retrying_client(client: httpx.AsyncClient, model: str, prompts, index: int, args, deadline: float,
                           records: list[Request]) -> None:
    """Closed loop until the deadline: send, and after a 429 wait --retry-ms and send again."""
    i = index
    while time.monotonic() < deadline:
        record = Request(index, True, False, time.monotonic())
        await _one(client, model, prompts[i % len(prompts)], args.max_tokens, record)
        record.e2e_s = time.monotonic() - record.started_s
        records.append(record)
        i += 1
        if record.status == 429:
            await asyncio.sleep(args.retry_ms / 1000)


def _arm_summary(name: str, records: list[Request], seconds: float, span: tuple[float, float],
                 ttft_buckets: dict[float, float], health) -> dict:
    admitted = [r for r in records if r.status == 200 and r.outcome == "ok"]
    statuses = Counter(r.status for r in records)
    answered = [latency for t, latency in health if span[0] <= t <= span[1] and latency is not None]
    return {"arm": name, "clients": len({r.client for r in records}), "seconds": seconds,
            "statuses": {str(status): count for status, count in sorted(statuses.items(), key=str)},
            "server_errors_5xx": sum(count for status, count in statuses.items() if status and status >= 500),
            "admitted_per_s": len(admitted) / seconds, "refused_per_s": statuses.get(429, 0) / seconds,
            "admitted_ttft_s": distribution([r.ttft_s for r in admitted if r.ttft_s is not None]),
            "server_ttft": _server_ttft(ttft_buckets),
            "admitted_inter_token_s": distribution([gap for r in admitted for gap in r.itl_s]),
            "admitted_e2e_s": distribution([r.e2e_s for r in admitted]),
            "health_s": {**(distribution(answered) or {}), "max": max(answered, default=None),
                         "failed": sum(latency is None for t, latency in health if span[0] <= t <= span[1])}}


def _retry_figure(summaries: list[dict], health):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4))
    probe, throughput = figure.subplots(1, 2)
    probe.plot([t for t, latency in health if latency is not None],
               [latency * 1000 for _, latency in health if latency is not None])
    probe.set(title="/health latency through the arms", xlabel="seconds", ylabel="ms")
    labels = [f"{s['arm']}\n{s['clients']} clients" for s in summaries]
    throughput.bar(labels, [s["admitted_per_s"] for s in summaries], label="admitted")
    throughput.bar(labels, [s["refused_per_s"] for s in summaries], bottom=[s["admitted_per_s"] for s in summaries],
                   color="tab:red", alpha=0.4, label="refused (429)")
    throughput.set(title="requests per second", ylabel="requests/s", yscale="log")
    throughput.legend()
    figure.tight_layout()
    return figure


async def _overload(url: str, args: argparse.Namespace) -> tuple[list[Request], list[tuple[float, float]]]:
    prompts = prompt_set("code", 128, seed=0, max_bytes=200)
    limits = httpx.Limits(max_connections=args.requests + 8, max_keepalive_connections=args.requests)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600, connect=60), limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        with HealthProber(url, args.health_every, started) as prober:
            records = [Request(i, True, False, 0.0) for i in range(args.requests)]
            await asyncio.gather(*(_one(client, model, prompts[i % len(prompts)], args.max_tokens, record)
                                   for i, record in enumerate(records)))
        health = prober.samples
    report.progress(f"overload: {args.requests} requests done in {time.monotonic() - started:.1f} s")
    return records, health


async def _one(client: httpx.AsyncClient, model: str, prompt, max_tokens: int, record: Request) -> None:
    body = {"model": model, **prompt.body(), "max_tokens": max_tokens, "temperature": 0.8, "ignore_eos": True,
            "stream": True}
    try:
        await stream_request(client, prompt.endpoint, body, record, time.perf_counter(), None)
    except httpx.HTTPError as error:
        record.outcome, record.error = "error", f"{type(error).__name__}: {error}"


class HealthProber:
    """Probes /health every `every` seconds from a process of its own, as a kubelet would: a thread beside the
    clients shared their interpreter, and a probe then waited behind their event loop and their garbage collections
    (quiet 2-core machine, same server: maxima of 77-305 ms from a thread, 10-21 ms from a process). Entering returns
    once the first probe has answered, so the probes cover whatever follows. samples: (seconds since started, latency,
    or None if the probe failed)."""

    def __init__(self, url: str, every: float, started: float):
        context = multiprocessing.get_context("spawn")
        self._stop, self._probing = context.Event(), context.Event()
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(target=_probe_health,
                                        args=(url, every, started, self._probing, self._stop, send), daemon=True)
        self.samples: list[tuple[float, float | None]] = []

    def __enter__(self) -> HealthProber:
        self._process.start()
        if not self._probing.wait(PROBER_START_SECONDS):
            self._process.kill()
            raise RuntimeError(f"the /health prober did not start within {PROBER_START_SECONDS} s")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.samples = self._receive.recv()
        self._process.join()


def _probe_health(url: str, every: float, started: float, probing, stop, send) -> None:
    samples = []
    with httpx.Client(base_url=url, timeout=10) as client:
        while not stop.is_set():
            sent = time.perf_counter()
            try:
                ok = client.get("/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            samples.append((time.monotonic() - started, time.perf_counter() - sent if ok else None))
            probing.set()
            stop.wait(every)
    send.send(samples)


def _figure(requests: list[Request], health: list[tuple[float, float]], itl_slo: float | None):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4))
    probe, gaps, outcomes = figure.subplots(1, 3)
    probe.plot([t for t, latency in health if latency is not None],
               [latency * 1000 for _, latency in health if latency is not None])
    probe.set(title="/health latency during the overload", xlabel="seconds", ylabel="ms")
    admitted = [gap for r in requests if r.status == 200 for gap in r.itl_s]
    if admitted:
        gaps.hist(admitted, bins=np.logspace(np.log10(max(min(admitted), 1e-4)), np.log10(max(admitted)), 50))
        gaps.set_xscale("log")
    if itl_slo is not None:
        gaps.axvline(itl_slo, color="tab:red", label=f"SLO p99 {itl_slo} s")
        gaps.legend()
    gaps.set(title="admitted requests' inter-token gaps", xlabel="seconds", ylabel="gaps")
    statuses = Counter(str(r.status) for r in requests)
    outcomes.bar(list(statuses), list(statuses.values()))
    outcomes.set(title=f"{len(requests)} requests at once", xlabel="HTTP status", ylabel="requests")
    figure.tight_layout()
    return figure
