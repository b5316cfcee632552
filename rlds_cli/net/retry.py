"""Failed HTTP requests: when to retry and how long to wait, and a short reason for a person
(a DNS failure recognised through urllib3's wrapping, without urllib3's pool/URL preamble).
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def name_not_resolved(exc: BaseException) -> bool:
    """Whether a requests/urllib3 error comes from a failed DNS lookup (``socket.gaierror``,
    which urllib3 wraps as ``NameResolutionError`` inside ``MaxRetryError``)."""
    import socket

    import urllib3

    kinds: tuple[type[BaseException], ...] = (socket.gaierror,)
    if hasattr(urllib3.exceptions, "NameResolutionError"):
        kinds += (urllib3.exceptions.NameResolutionError,)
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        e = stack.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kinds):
            return True
        stack.extend([e.__cause__, e.__context__, getattr(e, "reason", None), *e.args])
    return False


def describe_error(exc: BaseException) -> str:
    """A short reason: the cause urllib3 nests in its pool/URL preamble ("[Errno 111] Connection
    refused", "Read timed out"), at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text) or re.search(
        r"(Read timed out|Connection broken)", text
    )
    return f"{type(exc).__name__}: {m.group(1) if m else text}"[:300]


#: Retry-After values above this are treated as this (a misbehaving server must not park us).
MAX_RETRY_AFTER = 300.0
MAX_BACKOFF = 60.0


def backoff_delay(attempt: int, base: float, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...).

    Exponential back-off with jitter: between half and all of ``base * 2**(attempt-1)`` (capped at
    :data:`MAX_BACKOFF`), so clients that failed together do not retry together. A server's
    ``Retry-After`` (capped at :data:`MAX_RETRY_AFTER`) is a lower bound.
    """
    delay = min(MAX_BACKOFF, base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return delay


#: Requests one download of one URL may make in one command (a server whose every answer ends
#: early with a few new bytes would otherwise reset the stall budget forever). What arrived is
#: kept for the next command to resume.
MAX_REQUESTS = 64
#: Every this many requests, the back-off's floor doubles (also while progress is made).
_SLOWER_EVERY = 16


@dataclass
class RetryBudget:
    """The retry policy of rlds' HTTP calls: ``retries`` more tries after a failure without
    progress, at most ``max_requests`` requests in all, :func:`backoff_delay` between them.

    Attributes:
        requests: Requests made so far (the first one included).
        best: The furthest byte any try reached (progress is only a new furthest byte: a server
            resending the same beginning makes none).
    """

    retries: int
    base_delay: float
    failures: int = 0
    max_requests: int = MAX_REQUESTS
    requests: int = 1
    best: int = 0

    def next_delay(
        self, retry_after: float | None = None, *, progressed: bool = False, reached: int | None = None
    ) -> float | None:
        """Count a failed try; the seconds to wait before the next, or ``None`` when none is left.

        A try that ``progressed`` (to a byte beyond :attr:`best`, when ``reached`` is given)
        resets the failure count: ``retries`` is a budget per stall."""
        if reached is not None:
            progressed = progressed and reached > self.best
            self.best = max(self.best, reached)
        self.failures = 1 if progressed else self.failures + 1
        if self.failures > self.retries or self.out_of_requests:
            return None
        self.requests += 1
        attempt = max(self.failures, 1 + (self.requests - 1) // _SLOWER_EVERY)
        return backoff_delay(attempt, self.base_delay, retry_after)

    @property
    def out_of_requests(self) -> bool:
        """Whether the request cap, rather than a stall, ends the operation."""
        return self.requests >= self.max_requests

    def give_up(self, what: str, last: object) -> str:
        """The error message once :meth:`next_delay` returned ``None``."""
        if self.out_of_requests and self.failures <= self.retries:
            return (
                f"{what}: gave up after {self.requests} requests, each answer ending before the "
                f"end it announced (last error: {last}); a server keeps sending less than it says"
            )
        return f"{what} failed {self.failures} times in a row; last error: {last}"


def size_of(part: Path) -> int:
    """How far a partial download reached (0 when there is none)."""
    return part.stat().st_size if part.is_file() else 0


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) in seconds from now."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def is_retryable_status(status: int) -> bool:
    """429 and 5xx are worth retrying; other 4xx are not."""
    return status == 429 or 500 <= status < 600
