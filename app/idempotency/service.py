"""Idempotency keys in the database: claimed, kept with their first response, replayed, forgotten.

Invariants kept here:
- a key is claimed in the write's own transaction, and its response kept in it too, so both
  commit or neither does; a claim in flight makes a second claim of the key wait for it;
- a key binds the method, the path and the body (as canonical JSON) it was first used with;
- a key expires `ttl` seconds after its claim, and each claim purges a few expired ones;
- a kept response is forgotten when a document it names (in its request or its response) is
  erased: it can hold the document's text (an answer's quotes) or plain hashes, which an erasure
  removes everywhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Text

from app.errors import IdempotencyMismatch

# Expired keys one claim deletes at most: a claim adds one row, so the purge keeps pace.
_PURGED_PER_CLAIM = 16

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
    """
    WITH kept AS (
        UPDATE idempotency_keys SET status = :status, content_type = :content_type, body = :body
         WHERE tenant = :tenant AND key = :key
        RETURNING tenant, key)
    INSERT INTO idempotency_documents (tenant, document_id, key)
    SELECT kept.tenant, named.document_id, kept.key
      FROM kept, unnest(CAST(:documents AS text[])) AS named(document_id)
    -- Left by an expired claim of the key: it names the document all the same.
    ON CONFLICT DO NOTHING
    """
).bindparams(bindparam("documents", type_=ARRAY(Text)))

_FORGET = text(
    "DELETE FROM idempotency_keys k USING idempotency_documents d"
    " WHERE d.tenant = :tenant AND d.document_id = :document_id"
    " AND k.tenant = d.tenant AND k.key = d.key"
)


@dataclass(frozen=True, slots=True)
class KeptResponse:
    """The first response given under a key."""

    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Claim:
    """A key this transaction claimed: its response is to be kept before it commits."""

    session: AsyncSession
    tenant: str
    key: str

    async def keep(self, response: KeptResponse, *, request_body: Any) -> None:
        """Keep `response` with the claim, indexed by every document it or its request names."""
        documents = set(_document_ids(request_body)) | set(
            _document_ids(json.loads(response.body) if response.body else None)
        )
        await self.session.execute(
            _KEEP,
            {
                "tenant": self.tenant,
                "key": self.key,
                "status": response.status,
                "content_type": response.content_type,
                "body": response.body,
                "documents": sorted(documents),
            },
        )


def fingerprint(method: str, path: str, body: Any) -> str:
    """What a key is bound to: the method, the path, and the body as canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(f"{method}\n{path}\n{canonical}".encode()).hexdigest()


def _document_ids(value: Any) -> Iterator[str]:
    """Every `document_id` string anywhere in a JSON value."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name == "document_id" and isinstance(item, str):
                yield item
            else:
                yield from _document_ids(item)
    elif isinstance(value, list):
        for item in value:
            yield from _document_ids(item)


async def claim_or_replay(
    session: AsyncSession, *, tenant: str, key: str, fingerprint: str, ttl: int
) -> Claim | KeptResponse:
    """Claim `key` for this transaction, or the response it first had; or
    `IdempotencyMismatch` when it was first used with another request."""
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
        return KeptResponse(status=kept.status, content_type=kept.content_type, body=kept.body)
    raise RuntimeError("an idempotency key was neither claimed nor kept")


async def forget_document(session: AsyncSession, *, tenant: str, document_id: str) -> None:
    """Forget every kept response of `tenant` that names `document_id`: a retry of one is
    then done again, against the erased document."""
    await session.execute(_FORGET, {"tenant": tenant, "document_id": document_id})
