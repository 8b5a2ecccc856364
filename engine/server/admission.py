"""Admission control: bounds on the requests, and their prompt tokens, admitted but not yet started.

A request is waiting from its admission until the engine delivers its first token (or it ends without one); past
either bound a new request is refused at once, so the requests already admitted keep their latency.

With max_waiting_seconds the request bound follows Little's law: a queue of L requests that leave it at λ per second
holds each about L / λ seconds, so at most λ x max_waiting_seconds may wait. λ is measured over the departures of the
last RATE_WINDOW_SECONDS that left others waiting behind them (the engine's pace while it is the bottleneck; at light
load requests start at once, and the rate they leave at says nothing of what it could take). Until enough such
departures were seen, max_waiting_requests alone bounds the queue.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

RATE_WINDOW_SECONDS = 10.0
MIN_BUSY_DEPARTURES = 8     # fewer in the window: no rate to derive a bound from


@dataclass(frozen=True)
class AdmissionLimits:
    max_waiting_requests: int | None = None     # None: unbounded (but by max_waiting_seconds, where set)
    max_waiting_tokens: int | None = None
    retry_after_seconds: int = 1
    max_waiting_seconds: float | None = None    # the wait the queue is sized for (Little's law); None: no such bound
    refusal_delay_seconds: float = 0.0          # how long the edge holds a 429 for a full queue before sending it


class Overloaded(RuntimeError):
    """The request would take a queue past its bound; `reason` names which."""

    def __init__(self, reason: str, message: str, retry_after_seconds: int):
        super().__init__(message)
        self.reason, self.retry_after_seconds = reason, retry_after_seconds


REFUSAL_REASONS = ("requests_waiting", "tokens_waiting", "body_too_large", "prompt_too_long", "sse_clients")


class Refusals:
    """How many requests each limit refused (reason -> count), for /metrics."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)

    def count(self, reason: str) -> None:
        with self._lock:
            self.counts[reason] = self.counts.get(reason, 0) + 1


class Admission:
    """Thread-safe: requests are admitted on the event loop and started or ended on the engine's thread."""

    def __init__(self, limits: AdmissionLimits = AdmissionLimits(), refusals: Refusals | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.refusals = refusals or Refusals()
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: dict[str, int] = {}          # request id -> prompt tokens
        self._busy_departures: deque[float] = deque()
        self.waiting_tokens = 0

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting)

    def departure_rate(self) -> float | None:
        """Requests per second leaving the queue while others waited, over the last RATE_WINDOW_SECONDS; None with
        fewer than MIN_BUSY_DEPARTURES there."""
        with self._lock:
            self._forget_old(self._clock())
            if len(self._busy_departures) < MIN_BUSY_DEPARTURES:
                return None
            return len(self._busy_departures) / RATE_WINDOW_SECONDS

    def request_bound(self) -> int | None:
        """How many requests may wait now: max_waiting_requests, lowered to what max_waiting_seconds allows at the
        measured departure rate."""
        return self._request_bound()[0]

    def _request_bound(self) -> tuple[int | None, str]:
        """The bound, and what set it (for the refusal's message)."""
        fixed, seconds = self.limits.max_waiting_requests, self.limits.max_waiting_seconds
        rate = self.departure_rate() if seconds is not None else None
        if rate is None or (fixed is not None and fixed <= rate * seconds):
            return fixed, "GOVERNOR_MAX_WAITING_REQUESTS"
        bound = max(1, math.floor(rate * seconds))
        return bound, f"{rate:.1f} requests/s start, so {bound} wait about {seconds:g} s, GOVERNOR_MAX_WAITING_SECONDS"

    def refuse_if_full(self) -> None:
        """Raise Overloaded (counted) if no request could be admitted now, before anything is read or parsed."""
        bound, why = self._request_bound()
        if bound is not None and len(self._waiting) >= bound:
            self._refuse("requests_waiting", f"{len(self._waiting)} requests are already waiting (the bound is "
                         f"{bound}: {why})")

    def admit(self, request_id: str, prompt_tokens: int) -> None:
        """Count the request as waiting, or raise Overloaded and count the refusal."""
        (max_requests, why), max_tokens = self._request_bound(), self.limits.max_waiting_tokens
        with self._lock:
            if max_requests is not None and len(self._waiting) >= max_requests:
                self._refuse("requests_waiting", f"{len(self._waiting)} requests are already waiting (the bound is "
                             f"{max_requests}: {why})")
            if max_tokens is not None and self.waiting_tokens + prompt_tokens > max_tokens:
                self._refuse("tokens_waiting", f"{self.waiting_tokens} prompt tokens are already waiting and this "
                             f"request brings {prompt_tokens} (the bound is {max_tokens}, "
                             "GOVERNOR_MAX_WAITING_TOKENS)")
            self._waiting[request_id] = prompt_tokens
            self.waiting_tokens += prompt_tokens

    def started(self, request_id: str) -> None:
        """The request delivered its first token, ended or was cancelled; idempotent."""
        with self._lock:
            if request_id not in self._waiting:
                return
            self.waiting_tokens -= self._waiting.pop(request_id)
            if self._waiting:
                now = self._clock()
                self._busy_departures.append(now)
                self._forget_old(now)

    def _forget_old(self, now: float) -> None:
        while self._busy_departures and self._busy_departures[0] < now - RATE_WINDOW_SECONDS:
            self._busy_departures.popleft()

    def _refuse(self, reason: str, message: str) -> None:
        self.refusals.count(reason)
        raise Overloaded(reason, f"server overloaded: {message}; retry after {self.limits.retry_after_seconds} s",
                         self.limits.retry_after_seconds)
