"""What every benchmark writes: the machine it ran on, the exact command, JSON, a PNG, progress and a table."""
from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch

NOT_FLAGS = {"run", "command", "bench"}


def machine() -> dict:
    import transformers

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": load_average(),
    }


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: other work on the machine shows here and skews timings."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def command(prog: str, args: argparse.Namespace) -> str:
    """The command line that repeats this run, with every setting spelled out."""
    words = [prog]
    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if name in NOT_FLAGS or value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, (list, tuple)):
            words += [flag, *map(str, value)]
        else:
            words += [flag, str(value)]
    return " ".join(words)


def int_in(low: int, high: int):
    """An argparse type: an integer in low..high, or a message naming the range."""
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {value}")
        return value
    return parse


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")


def save_figure(figure, path: Path) -> None:
    """figure: a matplotlib.figure.Figure (made without pyplot, so no display or global state is involved)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")


def write_results(folder: Path, name: str, data: dict, figure, summary: str) -> None:
    """NAME.json and NAME.png in folder, then the summary and where they went."""
    write_json(folder / f"{name}.json", data)
    save_figure(figure, folder / f"{name}.png")
    progress(summary)
    took = f" in {data['wall_seconds']:.0f} s" if "wall_seconds" in data else ""
    progress(f"wrote {folder / f'{name}.json'} and {folder / f'{name}.png'}{took}")


def progress(line: str) -> None:
    print(line, flush=True)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)
