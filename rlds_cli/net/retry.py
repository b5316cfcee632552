"""When to retry, and how long to wait."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

#: Retry-After values above this are treated as this (a misbehaving server must not park us).
MAX_RETRY_AFTER = 300.0
MAX_BACKOFF = 60.0


def backoff_delay(attempt: int, base: float, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1, 2, ...).

    Exponential back-off with "full jitter" (a random delay between half and all of
    ``base * 2**(attempt-1)``, capped), so clients that failed together do not retry together.
    A server's ``Retry-After`` is a lower bound.
    """
    delay = min(MAX_BACKOFF, base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return delay


@dataclass
class RetryBudget:
    """The one retry policy of rlds' HTTP calls: ``retries`` tries more after a failure, with
    :func:`backoff_delay` between them."""

    retries: int
    base_delay: float
    failures: int = 0

    def next_delay(self, retry_after: float | None = None, *, progressed: bool = False) -> float | None:
        """Count a failed try and return the seconds to wait before the next one, or ``None`` when
        no try is left. A try that ``progressed`` (useful bytes arrived) makes its failure the
        first again: a budget per stall, not per operation."""
        self.failures = 1 if progressed else self.failures + 1
        if self.failures > self.retries:
            return None
        return backoff_delay(self.failures, self.base_delay, retry_after)


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
