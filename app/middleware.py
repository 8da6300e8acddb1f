"""The outermost layer of every request: request id, body limit, the last-resort 500, and the
request's log line and metrics.

The body is counted while it streams in and refused with 413 before anything parses it; a
request whose client left before its body ended is not handled at all. An exception nothing
else handled is answered as `internal_error` here, without re-raising, so its message (which
may quote stored text) reaches no log and no client. Every request, whatever its end, is
counted and timed by its route template (never the raw path, which is unbounded) and logged as
one line: request id, tenant, route template, method, status and duration, nothing of the body
or the query string.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import fastapi.routing
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PayloadTooLarge, internal_error, problem
from app.metrics import Metrics

logger = logging.getLogger("app.requests")

REQUEST_ID_HEADER = "x-request-id"
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
    """Assigns the request id, enforces the body limit, catches what nothing else did, and
    logs, counts and times every request."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        begun = time.perf_counter()
        given = dict(scope["headers"]).get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1")
        exchange = _Exchange(given if _SAFE_REQUEST_ID.match(given) else secrets.token_hex(8))
        scope.setdefault("state", {})["request_id"] = exchange.request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = int(message["status"])
                message["headers"] = [
                    *message.get("headers", []),
                    (REQUEST_ID_HEADER.encode(), exchange.request_id.encode()),
                ]
            await send(message)

        try:
            await self._guarded(scope, receive, send_with_id, exchange)
        finally:
            self._observe(scope, exchange, time.perf_counter() - begun)

    async def _guarded(
        self, scope: Scope, receive: Receive, send_with_id: Send, exchange: _Exchange
    ) -> None:
        headers = dict(scope["headers"])
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        try:
            if declared > self.max_body_bytes:
                raise _BodyTooLarge
            body = await self._read_body(receive)
        except _BodyTooLarge:
            await self._too_large(scope, receive, send_with_id)
            return
        except _ClientDisconnected:
            # No one is left to answer, and a body cut short must never be handled as whole.
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
        except Exception as exc:
            response = internal_error(exc)
            if exchange.status is None:
                await response(scope, receive, send_with_id)

    def _observe(self, scope: Scope, exchange: _Exchange, seconds: float) -> None:
        route = route_template(scope)
        method = str(scope.get("method", ""))
        # No status: the client left before any response, so none was sent.
        status = str(exchange.status) if exchange.status is not None else "none"
        self.metrics.requests.labels(route=route, method=method, status=status).inc()
        self.metrics.latency.labels(route=route, method=method).observe(seconds)
        principal = scope.get("state", {}).get("principal")
        logger.info(
            "request",
            extra={
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

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLarge(
            f"the body is over the limit of {self.max_body_bytes} bytes", limit=self.max_body_bytes
        )
        response = problem(error.status, error.code, error.title, error.detail, **error.extensions)
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
