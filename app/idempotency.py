"""`Idempotency-Key` on the writes: a retry of a request gets the first response, written once.

A write that takes the `Idempotent` dependency claims its key (per tenant) in the request's own
transaction before it does anything else. The response it then answers (its 2xx, or a
rejection recorded for audit) is kept with the claim, in that same transaction, so the write and
its kept response commit together or not at all. A later request with the key:
- same method, path and body: the kept response again, with `Idempotent-Replayed: true`, and
  nothing written;
- anything else: 422 `idempotency_mismatch`;
- while the first is still in flight: it waits for the first to commit (the claim holds the
  key's row), then replays it; or claims the key itself if the first rolled back.

A failure that rolls back (401, 404, 409, 503, ...) keeps nothing, so its retry runs afresh. A key
expires `idempotency_ttl` seconds after its claim; an expired key is claimed anew, and each claim
purges a few of its tenant's expired keys, so the table holds about one row per key still live.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request, Response
from fastapi.routing import APIRoute
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.access.service import Principal
from app.config import SettingsDep
from app.db import SessionDep
from app.errors import IdempotencyMismatch, grounding_problem, keeps_work

REPLAYED = "Idempotent-Replayed"
# Expired keys one claim deletes at most: a claim adds one row, so the purge keeps pace.
_PURGED_PER_CLAIM = 16

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

_CLAIM = text(
    """
    WITH purged AS (
        DELETE FROM idempotency_keys WHERE ctid IN (
            SELECT ctid FROM idempotency_keys
             WHERE tenant = :tenant AND key <> :key
               AND created_at < now() - make_interval(secs => :ttl)
             LIMIT :purged FOR UPDATE SKIP LOCKED))
    INSERT INTO idempotency_keys (tenant, key, fingerprint, created_at)
    VALUES (:tenant, :key, :fingerprint, now())
    ON CONFLICT (tenant, key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, created_at = EXCLUDED.created_at,
           status = NULL, content_type = NULL, body = NULL
     WHERE idempotency_keys.created_at < now() - make_interval(secs => :ttl)
    RETURNING true
    """
)

_KEPT = text(
    "SELECT fingerprint, status, content_type, body FROM idempotency_keys"
    " WHERE tenant = :tenant AND key = :key"
)

_KEEP = text(
    "UPDATE idempotency_keys SET status = :status, content_type = :content_type, body = :body"
    " WHERE tenant = :tenant AND key = :key"
)


@dataclass(frozen=True, slots=True)
class Claim:
    """A key this request claimed: its response is to be kept before the transaction commits."""

    session: AsyncSession
    tenant: str
    key: str

    async def keep(self, response: Response) -> None:
        await self.session.execute(
            _KEEP,
            {
                "tenant": self.tenant,
                "key": self.key,
                "status": response.status_code,
                "content_type": response.headers.get("content-type"),
                "body": bytes(response.body),
            },
        )


class Replayed(Exception):
    """Raised by the dependency to answer with the kept response instead of running the route."""

    def __init__(self, response: Response) -> None:
        super().__init__("idempotent replay")
        self.response = response


def fingerprint(method: str, path: str, body: Any) -> str:
    """What a key is bound to: the method, the path, and the body as canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(f"{method}\n{path}\n{canonical}".encode()).hexdigest()


async def _claim_or_replay(
    session: AsyncSession, *, tenant: str, key: str, fingerprint: str, ttl: int
) -> Claim:
    claim = {"tenant": tenant, "key": key, "fingerprint": fingerprint, "ttl": ttl}
    # A second pass only when the kept row expired and was purged between the two statements.
    for _ in range(2):
        claimed = await session.execute(_CLAIM, claim | {"purged": _PURGED_PER_CLAIM})
        if claimed.scalar() is not None:
            return Claim(session=session, tenant=tenant, key=key)
        kept = (await session.execute(_KEPT, {"tenant": tenant, "key": key})).one_or_none()
        if kept is None:
            continue
        if kept.fingerprint != fingerprint:
            raise IdempotencyMismatch(
                "this Idempotency-Key was used with another request; use a new key for it"
            )
        replay = Response(content=kept.body, status_code=kept.status, headers={REPLAYED: "true"})
        replay.headers["content-type"] = kept.content_type
        raise Replayed(replay)
    raise RuntimeError("an idempotency key was neither claimed nor kept")


async def idempotent(
    request: Request, session: SessionDep, settings: SettingsDep, key: KeyHeader = None
) -> None:
    """Claim `Idempotency-Key` for this request, or answer with what it first answered."""
    if key is None:
        return
    principal = getattr(request.state, "principal", None)
    # The route's key dependency runs first: a route lists this dependency after it.
    assert isinstance(principal, Principal), "Idempotent must follow the route's key"
    try:
        body = await request.json()
    except ValueError:
        return  # not JSON: validating the body refuses the request
    request.state.idempotency = await _claim_or_replay(
        session,
        tenant=principal.tenant,
        key=key,
        fingerprint=fingerprint(request.method, request.url.path, body),
        ttl=settings.idempotency_ttl,
    )


Idempotent = Annotated[None, Depends(idempotent, scope="function")]


class IdempotentRoute(APIRoute):
    """A route that keeps the response of a request that claimed a key, or replays it.

    The request's transaction is still open here: the session commits once the route handler
    has returned (or raised a rejection that keeps its record), so the kept response commits
    with the write.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def handle_idempotently(request: Request) -> Response:
            try:
                response = await handle(request)
            except Replayed as replayed:
                return replayed.response
            except Exception as exc:
                claim = getattr(request.state, "idempotency", None)
                if claim is not None and keeps_work(exc):
                    await claim.keep(grounding_problem(exc))
                raise
            claim = getattr(request.state, "idempotency", None)
            if claim is not None:
                await claim.keep(response)
            return response

        return handle_idempotently
