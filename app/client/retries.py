"""When the client tries a request again, and how long it waits first.

Every request the client sends can be repeated without writing twice: a read (GET, and
`POST /v1/citations/resolve`, which reads) by its nature, and a write because it carries an
`Idempotency-Key`, the same on each attempt, so the service answers a repeat of a write that
committed with its first response. So a request is tried again after:
- a transport error: its connection never opened, or its answer was lost on the way;
- a 503: the service could not reach its database, or was shutting down.

Any other status is raised at once. Retries stop after `retries` more attempts, or when the next
wait would end past `budget` seconds from the first attempt. A wait is the `Retry-After` the
service asked for, else an exponential backoff, and never longer than `max_wait`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_READ_POSTS = frozenset({"/v1/citations/resolve"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many more attempts, within how many seconds, with waits of at most `max_wait`."""

    retries: int = 3
    budget: float = 30.0
    max_wait: float = 10.0
    backoff: float = 0.25

    def wait(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt `attempt + 1` (the first attempt is 0)."""
        wanted = retry_after if retry_after is not None else self.backoff * 2**attempt
        return max(0.0, min(self.max_wait, wanted))

    def allows(self, attempt: int, elapsed: float, wait: float) -> bool:
        """Whether attempt `attempt + 1` may start after `wait`, `elapsed` seconds in."""
        return attempt < self.retries and elapsed + wait <= self.budget


def is_read(method: str, path: str) -> bool:
    """Whether the request only reads, so it needs no `Idempotency-Key` to be repeated."""
    return method.upper() in _READ_METHODS or (method.upper() == "POST" and path in _READ_POSTS)


def retry_after(response: httpx.Response) -> float | None:
    """The response's `Retry-After` in seconds (delta or HTTP date), or None."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def should_retry(response: httpx.Response) -> bool:
    """Whether an answered request may be repeated: a 503."""
    return response.status_code == 503
