"""The outermost layer of every request: request id, body limits, the last-resort 500, and the
request's log line and metrics.

The body is counted while it streams in and refused with 413 before anything parses it; once
whole, it is refused with 422 when it nests deeper than the limit, as parsers and validators
recurse once a level. A request whose client left before its body ended is not handled at all.
An exception nothing else handled is answered as `internal_error` here, without re-raising, so
its message (which may quote stored text) reaches no log and no client; a request cut off by a
shutdown past its grace period is answered 503. Every request, whatever its end, is counted and
timed by its route template (never the raw path, which is unbounded) and logged as one line:
request id, tenant, route template, method, status and duration, nothing of the body or the
query string.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import fastapi.routing
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import AppError, InvalidRequest, PayloadTooLarge, internal_error, problem
from app.logs import log_fields
from app.metrics import Metrics

logger = logging.getLogger("app.requests")

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# The route label of a request that matched no route: its path is not a label.
UNMATCHED_ROUTE = "unmatched"


class _BodyTooLarge(Exception):
    pass


class _ClientDisconnected(Exception):
    pass


@dataclass(slots=True)
class _Exchange:
    """What the guard knows of one request and the response it got so far."""

    request_id: str
    status: int | None = None


class RequestGuard:
    """Assigns the request id, enforces the body limits, catches what nothing else did, and
    logs, counts and times every request."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, max_depth: int, metrics: Metrics
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_depth = max_depth
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        begun = time.perf_counter()
        headers = dict(scope["headers"])
        given = headers.get(_REQUEST_ID_KEY, b"").decode("latin-1")
        exchange = _Exchange(given if _SAFE_REQUEST_ID.match(given) else _new_request_id())
        scope.setdefault("state", {})["request_id"] = exchange.request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = int(message["status"])
                message["headers"] = [
                    *message.get("headers", []),
                    (_REQUEST_ID_KEY, exchange.request_id.encode()),
                ]
            await send(message)

        try:
            await self._guarded(scope, headers, receive, send_with_id, exchange)
        finally:
            self._observe(scope, exchange, time.perf_counter() - begun)

    async def _guarded(
        self,
        scope: Scope,
        headers: dict[bytes, bytes],
        receive: Receive,
        send_with_id: Send,
        exchange: _Exchange,
    ) -> None:
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        try:
            if declared > self.max_body_bytes:
                raise _BodyTooLarge
            body = await self._read_body(receive)
        except _BodyTooLarge:
            too_large = PayloadTooLarge(
                f"the body is over the limit of {self.max_body_bytes} bytes",
                limit=self.max_body_bytes,
            )
            # The rest of the body is not read: the connection cannot serve another request.
            await _refuse(too_large, scope, receive, send_with_id, close=True)
            return
        except _ClientDisconnected:
            # No one is left to answer, and a body cut short must never be handled as whole.
            return
        if body and nests_deeper(body, self.max_depth):
            too_deep = InvalidRequest(
                f"the body nests arrays and objects over {self.max_depth} levels deep",
                limit=self.max_depth,
            )
            await _refuse(too_deep, scope, receive, send_with_id, close=False)
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            await self.app(scope, replay, send_with_id)
        except asyncio.CancelledError:
            # Cut off by a shutdown whose grace period ran out (its transaction rolls back).
            # Unlike an unreachable database, this cannot say that nothing committed, so it
            # asks for no retry (no Retry-After).
            if exchange.status is None:
                cut_off = problem(
                    503,
                    "service_unavailable",
                    "Service unavailable",
                    "the service stopped before this request was done",
                    {"connection": "close"},
                )
                await cut_off(scope, receive, send_with_id)
            raise
        except Exception as exc:
            response = internal_error(exc)
            if exchange.status is None:
                await response(scope, receive, send_with_id)

    def _observe(self, scope: Scope, exchange: _Exchange, seconds: float) -> None:
        route = route_template(scope)
        method = str(scope.get("method", ""))
        # No status: the client left before any response, so none was sent.
        status = str(exchange.status) if exchange.status is not None else "none"
        self.metrics.observe_request(route=route, method=method, status=status, seconds=seconds)
        principal = scope.get("state", {}).get("principal")
        log_fields(
            logger,
            "request",
            {
                "request_id": exchange.request_id,
                "tenant": getattr(principal, "tenant", None),
                "route": route,
                "method": method,
                "status": exchange.status,
                "duration_ms": round(seconds * 1000, 3),
            },
        )

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientDisconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _new_request_id() -> str:
    # A request id names a request in logs and is no secret (a client may choose its own): 64
    # bits from the process's generator, seeded afresh in every worker, cost half of what the
    # system's random source does.
    return f"{random.getrandbits(64):016x}"


async def _refuse(
    error: AppError,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    close: bool,
) -> None:
    response = problem(error.status, error.code, error.title, error.detail, **error.extensions)
    if close:
        response.headers["connection"] = "close"
    await response(scope, receive, send)


def route_template(scope: Scope) -> str:
    """The path template of the route `scope` matched (or would match), else `UNMATCHED_ROUTE`."""
    route = scope.get("route")
    if route is None:
        # Refused before routing (413): the route it was meant for, found the router's way.
        for candidate in _routes(scope.get("app")):
            match, _ = candidate.matches(scope)
            if match is not Match.NONE:
                route = candidate
                break
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    return template if isinstance(template, str) else UNMATCHED_ROUTE


def _routes(app: object) -> Iterable[Any]:
    routes = getattr(app, "routes", ())
    # FastAPI nests included routers; this (when it has it) yields the routes inside them.
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    return flatten(routes) if flatten is not None else routes


# Each opening bracket as a step of +1, each closing one as -1 (a signed byte).
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")
# Every byte but the brackets and the quote, which say where strings are.
_NOT_MARKS = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_BLOCK = 1 << 16


def nests_deeper(body: bytes, limit: int) -> bool:
    """Whether the JSON in `body` nests arrays and objects more than `limit` levels deep.

    Nothing is parsed: only brackets and quotes are kept, what lies between quotes (brackets in
    strings) is cut out, the brackets become steps up and down, and the running level is summed
    a block at a time, at C speed; a block with too few openings to reach the limit is only
    counted. A body that is not balanced is left to the parser to refuse.
    """
    # Escaped backslashes go first, so that what is left of `\"` is an escaped quote. A body
    # with no backslash has neither.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in body else body
    marks = unescaped.translate(None, _NOT_MARKS)
    # A string with no bracket in it leaves two quotes side by side. When taking such pairs out
    # (from the left) leaves no quote, the first quote went with the second, the third with the
    # fourth, and so on: the strings' own pairs, with nothing between. Else cut strings out.
    brackets = marks.replace(b'""', b"")
    if b'"' in brackets:
        brackets = b"".join(marks.split(b'"')[::2])
    steps = brackets.translate(_STEPS)
    level = 0
    for start in range(0, len(steps), _BLOCK):
        block = steps[start : start + _BLOCK]
        openings = block.count(1)
        if level + openings <= limit:
            level += 2 * openings - len(block)
            continue
        levels = list(accumulate(array("b", block), initial=level))
        if max(levels) > limit:
            return True
        level = levels[-1]
    return False
