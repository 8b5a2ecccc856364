"""Admission control: bounds on the requests, and their prompt tokens, admitted but not yet started.

A request is waiting from its admission until the engine delivers its first token (or it ends without one); past
either bound a new request is refused at once, so the requests already admitted keep their latency.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionLimits:
    max_waiting_requests: int | None = None     # None: unbounded
    max_waiting_tokens: int | None = None
    retry_after_seconds: int = 1


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

    def __init__(self, limits: AdmissionLimits = AdmissionLimits(), refusals: Refusals | None = None):
        self.limits = limits
        self.refusals = refusals or Refusals()
        self._lock = threading.Lock()
        self._waiting: dict[str, int] = {}          # request id -> prompt tokens
        self.waiting_tokens = 0

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting)

    def refuse_if_full(self) -> None:
        """Raise Overloaded (counted) if no request could be admitted now, before anything is read or parsed."""
        max_requests = self.limits.max_waiting_requests
        if max_requests is not None and len(self._waiting) >= max_requests:
            with self._lock:
                self._refuse("requests_waiting", f"{len(self._waiting)} requests are already waiting (the bound "
                             f"is {max_requests}, GOVERNOR_MAX_WAITING_REQUESTS)")

    def admit(self, request_id: str, prompt_tokens: int) -> None:
        """Count the request as waiting, or raise Overloaded and count the refusal."""
        max_requests, max_tokens = self.limits.max_waiting_requests, self.limits.max_waiting_tokens
        with self._lock:
            if max_requests is not None and len(self._waiting) >= max_requests:
                self._refuse("requests_waiting", f"{len(self._waiting)} requests are already waiting (the bound is "
                             f"{max_requests}, GOVERNOR_MAX_WAITING_REQUESTS)")
            if max_tokens is not None and self.waiting_tokens + prompt_tokens > max_tokens:
                self._refuse("tokens_waiting", f"{self.waiting_tokens} prompt tokens are already waiting and this "
                             f"request brings {prompt_tokens} (the bound is {max_tokens}, "
                             "GOVERNOR_MAX_WAITING_TOKENS)")
            self._waiting[request_id] = prompt_tokens
            self.waiting_tokens += prompt_tokens

    def started(self, request_id: str) -> None:
        """The request delivered its first token, ended or was cancelled; idempotent."""
        with self._lock:
            self.waiting_tokens -= self._waiting.pop(request_id, 0)

    def _refuse(self, reason: str, message: str) -> None:
        self.refusals.count(reason)
        raise Overloaded(reason, f"server overloaded: {message}; retry after {self.limits.retry_after_seconds} s",
                         self.limits.retry_after_seconds)
