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

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import Statements
from app.errors import IdempotencyMismatch

# Expired keys one claim deletes at most: a claim adds one row, so the purge keeps pace.
_PURGED_PER_CLAIM = 16

# Parameters: tenant, key, fingerprint, ttl in seconds, keys purged at most.
_CLAIM = """
    WITH purged AS (
        DELETE FROM idempotency_keys WHERE ctid IN (
            SELECT ctid FROM idempotency_keys
             WHERE tenant = $1 AND key <> $2
               AND created_at < now() - make_interval(secs => $4)
             LIMIT $5 FOR UPDATE SKIP LOCKED))
    INSERT INTO idempotency_keys (tenant, key, fingerprint, created_at)
    VALUES ($1, $2, $3, now())
    ON CONFLICT (tenant, key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, created_at = EXCLUDED.created_at,
           status = NULL, content_type = NULL, body = NULL
     WHERE idempotency_keys.created_at < now() - make_interval(secs => $4)
    RETURNING true
    """

_KEPT = (
    "SELECT fingerprint, status, content_type, body FROM idempotency_keys"
    " WHERE tenant = $1 AND key = $2"
)

# Parameters: tenant, key, status, content type, body, the documents it names.
_KEEP = """
    WITH kept AS (
        UPDATE idempotency_keys SET status = $3, content_type = $4, body = $5
         WHERE tenant = $1 AND key = $2
        RETURNING tenant, key)
    INSERT INTO idempotency_documents (tenant, document_id, key)
    SELECT kept.tenant, named.document_id, kept.key
      FROM kept, unnest($6::text[]) AS named(document_id)
    -- Left by an expired claim of the key: it names the document all the same.
    ON CONFLICT DO NOTHING
    """

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

    statements: Statements
    tenant: str
    key: str

    async def keep(self, response: KeptResponse, *, request_body: Any) -> None:
        """Keep `response` with the claim, indexed by every document it or its request names."""
        documents = set(_document_ids(request_body)) | set(
            _document_ids(json.loads(response.body) if response.body else None)
        )
        await self.statements.fetch(
            _KEEP,
            self.tenant,
            self.key,
            response.status,
            response.content_type,
            response.body,
            sorted(documents),
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
    statements: Statements, *, tenant: str, key: str, fingerprint: str, ttl: int
) -> Claim | KeptResponse:
    """Claim `key` for this transaction, or the response it first had; or
    `IdempotencyMismatch` when it was first used with another request."""
    # A second pass only when the kept row expired and was purged between the two statements.
    for _ in range(2):
        if await statements.fetch(_CLAIM, tenant, key, fingerprint, ttl, _PURGED_PER_CLAIM):
            return Claim(statements=statements, tenant=tenant, key=key)
        found = await statements.fetch(_KEPT, tenant, key)
        if not found:
            continue
        kept = found[0]
        if kept["fingerprint"] != fingerprint:
            raise IdempotencyMismatch(
                "this Idempotency-Key was used with another request; use a new key for it"
            )
        return KeptResponse(
            status=kept["status"], content_type=kept["content_type"], body=kept["body"]
        )
    raise RuntimeError("an idempotency key was neither claimed nor kept")


async def forget_document(session: AsyncSession, *, tenant: str, document_id: str) -> None:
    """Forget every kept response of `tenant` that names `document_id`: a retry of one is
    then done again, against the erased document."""
    await session.execute(_FORGET, {"tenant": tenant, "document_id": document_id})
