"""Open-loop arrival processes: offsets in seconds from the start of a phase, sorted, within [0, duration)."""

from __future__ import annotations

import math
import random

KINDS: tuple[str, ...] = ("poisson", "burst", "constant")


def constant(qps: float, duration_s: float) -> list[float]:
    _check(qps, duration_s)
    return [i / qps for i in range(math.ceil(duration_s * qps)) if i / qps < duration_s]


def poisson(qps: float, duration_s: float, seed: int = 0) -> list[float]:
    _check(qps, duration_s)
    rng = random.Random(seed)
    offsets, t = [], rng.expovariate(qps)
    while t < duration_s:
        offsets.append(t)
        t += rng.expovariate(qps)
    return offsets


def burst(qps: float, duration_s: float, seed: int = 0, size: int = 8) -> list[float]:
    """Groups of `size` requests arriving at the same instant; groups start as a Poisson process at qps / size."""
    if size < 1:
        raise ValueError(f"burst size must be >= 1, got {size}")
    return [start for start in poisson(qps / size, duration_s, seed) for _ in range(size)]


def offsets(kind: str, qps: float, duration_s: float, seed: int = 0, burst_size: int = 8) -> list[float]:
    if kind == "poisson":
        return poisson(qps, duration_s, seed)
    if kind == "burst":
        return burst(qps, duration_s, seed, burst_size)
    if kind == "constant":
        return constant(qps, duration_s)
    raise ValueError(f"arrival must be one of {', '.join(KINDS)}, got {kind!r}")


def _check(qps: float, duration_s: float) -> None:
    if qps <= 0:
        raise ValueError(f"qps must be > 0, got {qps}")
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
