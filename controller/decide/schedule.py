"""The k schedule the controller learns, one batch band at a time.

The goodput model measures costs per batch band (band b holds the batch sizes that round to 2^b on a log scale:
batch sizes 2^(b - 1/2) < n <= 2^(b + 1/2)). A trial can only measure the band the traffic is in now, so a trial
sets the k of that band, keeps the k of the bands never measured within what their learned neighbours allow, and
leaves the k of the bands already learned as it was.
"""
from __future__ import annotations

import math

from seam import DraftLenSchedule, EngineConfig


def band_batch_sizes(band: int) -> tuple[int, int]:
    """The batch sizes (lowest, highest) in band."""
    low = 1 if band <= 0 else math.floor(2 ** (band - 0.5)) + 1
    return low, max(low, math.floor(2 ** (band + 0.5)))


MAX_BAND = 10          # batch sizes up to 1448; larger batches take the last band's k


def learned(config: EngineConfig, band: int, k: int, measured_bands: set[int]) -> EngineConfig:
    """config drafting k in band; the measured bands keep their k. A band never measured keeps its k too, clamped so
    that it drafts no more than the nearest learned band below it and no less than the nearest learned band above it
    (the smaller bound wins where they cross): speculation pays less as the batch grows (vLLM's +23% at batch 1 was
    -16% at batch 32), so a k learned at batch 1 says how far larger batches may go, not that they should."""
    known = sorted({*measured_bands, band})

    def k_of(known_band: int, edge: int) -> int:
        return k if known_band == band else config.draft_len_for(band_batch_sizes(known_band)[edge])

    ks = {band: k}
    for guessed in (b for b in range(MAX_BAND + 1) if b not in known):
        below = [k_of(b, 1) for b in known if b < guessed]
        above = [k_of(b, 0) for b in known if b > guessed]
        now = config.draft_len_for(band_batch_sizes(guessed)[0])
        clamped = max(now, above[0]) if above else now
        clamped = min(clamped, below[-1]) if below else clamped
        if clamped != now:
            ks[guessed] = clamped
    return with_bands(config, ks)


def with_bands(config: EngineConfig, ks: dict[int, int]) -> EngineConfig:
    """config drafting ks[b] at the batch sizes of each band b, as before elsewhere; a schedule with one k everywhere
    becomes draft_len."""
    schedule = config.draft_len_bands
    for band, k in sorted(ks.items()):
        schedule = _with_band(schedule, band, k)
    return with_schedule(config, schedule)


def with_schedule(config: EngineConfig, schedule: DraftLenSchedule) -> EngineConfig:
    """config drafting by schedule; a schedule of one band is draft_len."""
    if len(schedule) == 1:
        return config.changed(draft_len=schedule[0][1], draft_len_schedule=None)
    return config.changed(draft_len_schedule=schedule)


def schedule_text(config: EngineConfig) -> str:
    """'k 4' or 'k by batch size: <=1: 8, <=4: 4, more: 0'."""
    if config.draft_len_schedule is None:
        return f"k {config.draft_len}"
    *bands, (_, last) = config.draft_len_schedule
    return "k by batch size: " + ", ".join([f"<={up_to}: {k}" for up_to, k in bands] + [f"more: {last}"])


def _with_band(before: DraftLenSchedule, band: int, k: int) -> DraftLenSchedule:
    """The last band (MAX_BAND) reaches every larger batch size."""
    low, high = band_batch_sizes(band)
    if band >= MAX_BAND:
        high = max(low, *(up_to for up_to, _ in before))
    edges = {up_to for up_to, _ in before} | {high} | ({low - 1} if low > 1 else set())
    if band < MAX_BAND:
        edges.add(high + 1)
    return _merged([(edge, k if low <= edge <= high else _k_at(before, edge)) for edge in sorted(edges)])


def _k_at(schedule: DraftLenSchedule, batch_size: int) -> int:
    return next((k for up_to, k in schedule if batch_size <= up_to), schedule[-1][1])


def _merged(bands: list[tuple[int, int]]) -> DraftLenSchedule:
    """Adjacent bands with the same k become one."""
    merged: list[tuple[int, int]] = []
    for up_to, k in bands:
        if merged and merged[-1][1] == k:
            merged[-1] = (up_to, k)
        else:
            merged.append((up_to, k))
    return tuple(merged)
