"""When the client tries a request again, and how long it waits first.

Only what cannot write twice is repeated:
- a read (GET, and `POST /v1/citations/resolve`, which reads) after a transport error or a 503;
- any request whose connection never opened (`ConnectError`, `ConnectTimeout`, `PoolTimeout`),
  since nothing reached the service;
- any request answered 503 with `Retry-After`: the service says so when it could not reach its
  database, so the request's transaction never committed.

Everything else (a write whose answer was lost, a 503 with no `Retry-After`, any other status)
is raised at once. Retries stop after `retries` more attempts, or when the next wait would end
past `budget` seconds from the first attempt. A wait is the `Retry-After` the service asked
for, else an exponential backoff, and never longer than `max_wait`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_READ_POSTS = frozenset({"/v1/citations/resolve"})
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


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
    """Whether the request only reads, so repeating it cannot write twice."""
    return method.upper() in _READ_METHODS or (method.upper() == "POST" and path in _READ_POSTS)


def never_sent(error: httpx.TransportError) -> bool:
    """Whether the request failed before its connection opened, so nothing reached the service."""
    return isinstance(error, _NEVER_SENT)


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


def should_retry(method: str, path: str, response: httpx.Response) -> bool:
    """Whether an answered request may be repeated: a 503 on a read, or with `Retry-After`."""
    if response.status_code != 503:
        return False
    return is_read(method, path) or retry_after(response) is not None
