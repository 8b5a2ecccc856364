"""`governor bench hostile`: hostile requests against a real `governor serve`: a 50 MB body (declared, and streamed
without a Content-Length), a lone UTF-16 surrogate and invalid UTF-8. For each: the status, the error's field, the
seconds to the answer and the server's RSS growth. Writes hostile.json and hostile.png."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from governor.bench import report
from governor.bench.served import ServedProcess
from governor.registry import DEFAULT_MODEL

NAME = "hostile"
HELP = "a 50 MB body, a lone surrogate, invalid UTF-8: status, field, seconds and server RSS growth for each"
JSON = {"content-type": "application/json"}
CHUNK = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model to serve (default {DEFAULT_MODEL})")
    parser.add_argument("--body-mb", type=report.int_in(1, 4096), default=50, help="the large body's size (MB)")
    parser.add_argument("--repeats", type=report.int_in(1, 1000), default=5, help="times each request is sent")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"),
                        help="folder for hostile.json and hostile.png")


def hostile_requests(model: str, body_mb: int) -> dict[str, dict]:
    """name -> httpx.post keyword arguments (fresh ones on each call: the streamed body is a generator)."""
    size = body_mb * 1_000_000
    prompt = json.dumps({"model": model, "prompt": "x", "max_tokens": 1})

    def streamed():
        sent = 0
        while sent < size:
            yield b" " * min(CHUNK, size - sent)
            sent += CHUNK
    return {
        "declared_body": {"content": b" " * size, "headers": JSON},
        "streamed_body": {"content": streamed(), "headers": JSON},
        "lone_surrogate": {"content": prompt.replace('"x"', '"\\ud800"').encode(), "headers": JSON},
        "invalid_utf8": {"content": prompt.encode().replace(b'"x"', b'"\xff\xfe"'), "headers": JSON},
    }


def run(args: argparse.Namespace) -> int:
    with ServedProcess(args.model) as server:
        results = {name: [] for name in hostile_requests(args.model, args.body_mb)}
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for _ in range(args.repeats):
                for name, kwargs in hostile_requests(args.model, args.body_mb).items():
                    results[name].append(_send(client, server, kwargs))
    data = {"settings": {"model": args.model, "body_mb": args.body_mb, "repeats": args.repeats},
            "requests": {name: _summary(rows) for name, rows in results.items()},
            "command": report.command("governor bench hostile", args), "machine": report.machine()}
    report.write_results(args.out, NAME, data, _figure(data), _table(data))
    return 0


def _send(client: httpx.Client, server: ServedProcess, kwargs: dict) -> dict:
    before = server.rss_bytes()
    sent = time.perf_counter()
    try:
        reply = client.post("/v1/completions", **kwargs)
        status, param = reply.status_code, reply.json().get("error", {}).get("param")
    except httpx.HTTPError as error:   # a server that stops reading may reset the connection mid-upload
        status, param = None, f"{type(error).__name__}: {error}"
    seconds = time.perf_counter() - sent
    return {"status": status, "param": param, "seconds": round(seconds, 4),
            "rss_growth_mb": round((server.rss_bytes() - before) / 1e6, 2)}


def _summary(rows: list[dict]) -> dict:
    return {"statuses": sorted({row["status"] for row in rows}, key=str),
            "params": sorted({str(row["param"]) for row in rows}),
            "max_seconds": max(row["seconds"] for row in rows),
            "max_rss_growth_mb": max(row["rss_growth_mb"] for row in rows), "rows": rows}


def _table(data: dict) -> str:
    return report.table(["request", "statuses", "field", "max seconds", "max RSS growth MB"],
                        [[name, ",".join(map(str, s["statuses"])), ",".join(s["params"]), f"{s['max_seconds']:.3f}",
                          f"{s['max_rss_growth_mb']:.1f}"] for name, s in data["requests"].items()])


def _figure(data: dict):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4))
    seconds, rss = figure.subplots(1, 2)
    names = list(data["requests"])
    seconds.bar(names, [data["requests"][n]["max_seconds"] * 1000 for n in names])
    seconds.set(title="slowest answer", ylabel="ms")
    rss.bar(names, [data["requests"][n]["max_rss_growth_mb"] for n in names])
    rss.set(title="largest server RSS growth", ylabel="MB")
    for axes in (seconds, rss):
        axes.tick_params(axis="x", labelrotation=20)
    figure.tight_layout()
    return figure
