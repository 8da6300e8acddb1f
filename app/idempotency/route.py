"""`Idempotency-Key` on the writes over HTTP: a retry of a request gets the first response.

A write that takes the `Idempotent` dependency (after its key; an agent's write in the
request's transaction on the driver takes `app.writes.AgentWriteDep`) claims the header's key
before it does anything else (`app.idempotency.service`); the route class then keeps what the
write answers, its 2xx or a rejection recorded for audit, while the request's transaction is
still open. A later request with the key and the same method, path and body is answered with
that response and `Idempotent-Replayed: true`, and writes nothing; with anything else it is 422
`idempotency_mismatch`. A failure that rolls back (401, 404, 409, 503, ...) keeps nothing, so
its retry runs afresh.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request, Response

from app.access.service import Principal
from app.bodies import Handler, JSONBodyRoute
from app.config import Settings, SettingsDep
from app.db import SessionDep, SessionStatements, Statements
from app.errors import grounding_problem, keeps_work
from app.headers import HandReadHeader
from app.idempotency import service as idempotency
from app.idempotency.service import Claim, KeptResponse

REPLAYED = "Idempotent-Replayed"

KeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description=(
            "Any 1 to 255 visible ASCII characters, unique per write (a UUID, say). A retry with"
            " the same key and the same request gets the first response, with"
            f" `{REPLAYED}: true`, and writes nothing; the key with another request is 422"
            " `idempotency_mismatch`. Keys are per tenant and expire (`idempotency_ttl`)."
        ),
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
    ),
]


class _Replayed(Exception):
    """Raised by the dependency to answer with the kept response instead of running the route."""

    def __init__(self, kept: KeptResponse) -> None:
        super().__init__("idempotent replay")
        self.kept = kept


async def idempotent(
    request: Request, session: SessionDep, settings: SettingsDep, key: KeyHeader = None
) -> None:
    """Claim `Idempotency-Key` for this request, in its session, or answer with what it first
    answered."""
    await claim(request, SessionStatements(session), settings, key)


# For an agent's write, which reads it itself (`app.writes`).
IDEMPOTENCY_KEY_HEADER = HandReadHeader(KeyHeader)


async def claim(
    request: Request, statements: Statements, settings: Settings, key: str | None
) -> None:
    """Claim `key` (the request's `Idempotency-Key`) for this request in `statements`, once its
    key was admitted, or raise to answer with what the key's request first answered."""
    if key is None:
        return
    # The route's key dependency ran before this one (a route lists this one after it), unless
    # its headers were invalid: then FastAPI goes on solving, and refuses the request with 422
    # once every dependency is solved, so nothing is written and there is nothing to keep.
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        return
    try:
        body = await request.json()
    except ValueError:
        return  # not JSON: validating the body refuses the request
    found = await idempotency.claim_or_replay(
        statements,
        tenant=principal.tenant,
        key=key,
        fingerprint=idempotency.fingerprint(request.method, request.url.path, body),
        ttl=settings.idempotency_ttl,
    )
    if isinstance(found, KeptResponse):
        raise _Replayed(found)
    request.state.idempotency = found


Idempotent = Annotated[None, Depends(idempotent, scope="function")]


def _kept(response: Response) -> KeptResponse:
    content_type = response.headers.get("content-type", "application/json")
    return KeptResponse(
        status=response.status_code, content_type=content_type, body=bytes(response.body)
    )


class IdempotentRoute(JSONBodyRoute):
    """A route that keeps the response of a request that claimed a key, or replays it.

    The request's transaction is still open here: it commits once the route handler has
    returned (or raised a rejection that keeps its record), so the kept response commits with
    the write.
    """

    def handler(self) -> Handler:
        handle = super().handler()

        async def handle_idempotently(request: Request) -> Response:
            try:
                response = await handle(request)
            except _Replayed as replayed:
                kept = replayed.kept
                return Response(
                    kept.body,
                    status_code=kept.status,
                    media_type=kept.content_type,
                    headers={REPLAYED: "true"},
                )
            except Exception as exc:
                claim: Claim | None = getattr(request.state, "idempotency", None)
                if claim is not None and keeps_work(exc):
                    rejection = _kept(grounding_problem(exc))
                    await claim.keep(rejection, request_body=await request.json())
                raise
            claim = getattr(request.state, "idempotency", None)
            if claim is not None:
                await claim.keep(_kept(response), request_body=await request.json())
            return response

        return handle_idempotently
