"""The outermost layer of every request: request id, body limit, and the last-resort 500.

The body is counted while it streams in and refused with 413 before anything parses it; a
request whose client left before its body ended is not handled at all. An exception nothing
else handled is answered as `internal_error` here, without re-raising, so its message (which
may quote stored text) reaches no log and no client.
"""

from __future__ import annotations

import re
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import PayloadTooLarge, internal_error, problem

REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class _BodyTooLarge(Exception):
    pass


class _ClientDisconnected(Exception):
    pass


class RequestGuard:
    """Assigns the request id, enforces the body limit, and catches what nothing else did."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1")
        request_id = given if _SAFE_REQUEST_ID.match(given) else secrets.token_hex(8)
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [
                    *message.get("headers", []),
                    (REQUEST_ID_HEADER.encode(), request_id.encode()),
                ]
            await send(message)

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
            if not started:
                await response(scope, receive, send_with_id)

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
