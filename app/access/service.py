"""Tenants and API keys.

Invariants kept here:
- a key's secret is shown once, at creation, and stored only as its sha256;
- secrets are compared in constant time, and every way a key can fail to open looks the same;
- a revoked key stops opening on the next request;
- a read that opens its key in its own statement (`keyed`) reads as no tenant unless the key
  opens and holds the scope.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

from asyncpg import Record
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import Columns, Statements
from app.errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from app.models import ApiKey, Tenant

SCOPES: Final = ("ingest", "agent", "support", "audit", "admin")

# Compared against when the key id is unknown, so that case costs what a wrong secret costs.
_UNKNOWN_KEY_DIGEST: Final = hashlib.sha256(b"no such key").hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key's tenant, its id and its scopes."""

    tenant: str
    key_id: str
    scopes: frozenset[str]


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A new key: its secret exists only here, once."""

    key: ApiKey
    secret: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


async def create_tenant(session: AsyncSession, *, name: str) -> tuple[Tenant, bool]:
    """Create a tenant, or find it unchanged; says whether this call created it."""
    created = await session.execute(
        insert(Tenant).values(name=name).on_conflict_do_nothing().returning(Tenant.name)
    )
    is_new = created.scalar_one_or_none() is not None
    tenant = (await session.execute(select(Tenant).where(Tenant.name == name))).scalar_one()
    return tenant, is_new


async def create_key(session: AsyncSession, *, tenant: str, scopes: list[str]) -> IssuedKey:
    """Issue a key for `tenant` with `scopes`; the secret is in the result and nowhere else."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InvalidRequest(f"scopes must be a non-empty subset of {', '.join(SCOPES)}")
    if await session.get(Tenant, tenant) is None:
        raise NotFound("no such tenant")
    key_id = f"key_{secrets.token_hex(8)}"
    secret = f"gsk_{key_id}_{secrets.token_urlsafe(32)}"
    key = ApiKey(
        key_id=key_id,
        tenant=tenant,
        secret_sha256=_digest(secret),
        scopes=sorted(set(scopes), key=SCOPES.index),
    )
    session.add(key)
    await session.flush()
    return IssuedKey(key=key, secret=secret)


async def revoke_key(session: AsyncSession, *, key_id: str) -> ApiKey:
    """Revoke a key; revoking it again keeps the first revocation time."""
    key = await session.get(ApiKey, key_id)
    if key is None:
        raise NotFound("no such key")
    if key.revoked_at is None:
        await session.execute(
            update(ApiKey).where(ApiKey.key_id == key_id).values(revoked_at=datetime.now(UTC))
        )
        await session.refresh(key)
    return key


def _key_id_of(secret: str) -> str | None:
    # Secrets read gsk_<key_id>_<random>; the key id itself is key_<hex>.
    parts = secret.split("_", 3)
    if len(parts) != 4 or parts[0] != "gsk" or parts[1] != "key":
        return None
    return f"key_{parts[2]}"


# The key's row, and the transaction scoped to its tenant in the same round trip. Should the
# secret not match, the request fails and its transaction is rolled back with the setting.
_AUTHENTICATE = (
    "SELECT tenant AS key_tenant, secret_sha256, scopes, revoked_at,"
    " set_config('app.tenant', tenant, true) AS scoped"
    " FROM api_keys WHERE key_id = $1"
)


async def authenticate(statements: Statements, *, secret: str) -> Principal:
    """The principal `secret` opens, with the transaction scoped to its tenant; or
    `Unauthorized`, which never says why."""
    key_id = _key_id_of(secret)
    rows = await statements.fetch(_AUTHENTICATE, key_id) if key_id is not None else []
    return opened(secret, rows[0] if rows else None)


def opened(secret: str, stored: Columns | None) -> Principal:
    """The principal `secret` opens, given the row of the key it names (None: no such key); or
    `Unauthorized`, which never says why."""
    key_id = _key_id_of(secret)
    expected = stored["secret_sha256"] if stored is not None else _UNKNOWN_KEY_DIGEST
    opens = hmac.compare_digest(_digest(secret), expected)
    if stored is None or not opens or stored["revoked_at"] is not None or key_id is None:
        raise Unauthorized("a valid API key is required")
    return Principal(tenant=stored["key_tenant"], key_id=key_id, scopes=frozenset(stored["scopes"]))


def keyed(work: str) -> str:
    """One statement that opens a key and does `work` as its tenant, in one round trip.

    Its parameters are the key id ($1), the digest of the secret ($2) and the scopes that admit
    the work ($3), then the work's own, from $4. `work` names its tenant `key.scoped`, the
    setting the key's row made; its rows come back beside the key's (`key_tenant`, `secret_sha256`,
    `scopes`, `revoked_at`), as one row with no work columns when it found nothing, and no row
    at all when there is no such key. The statement is scoped (`app.tenant`, for row-level
    security) to the key's tenant only when the digest matches, the key is not revoked and it
    holds one of the scopes; otherwise to no tenant, so the work reads nothing. The caller still
    decides with `opened`, in constant time, and refuses a key that lacks the scope.
    """
    # MATERIALIZED and OFFSET 0 keep the key's row apart from the work, and the work reads the
    # tenant from that row: the setting is made before any of the work's rows is scanned.
    return f"""
        WITH key AS MATERIALIZED (
          SELECT tenant AS key_tenant, secret_sha256, scopes, revoked_at,
                 set_config('app.tenant',
                            CASE WHEN secret_sha256 = $2 AND revoked_at IS NULL
                                  AND scopes && $3::text[]
                                 THEN tenant ELSE '' END,
                            true) AS scoped
            FROM api_keys WHERE key_id = $1)
        SELECT key.key_tenant, key.secret_sha256, key.scopes, key.revoked_at, work.*
          FROM key LEFT JOIN LATERAL ({work} OFFSET 0) AS work ON true
    """


def admitted(principal: Principal, scopes: frozenset[str]) -> Principal:
    """`principal`, if it holds one of `scopes`; else `Forbidden`."""
    if not principal.scopes & scopes:
        raise Forbidden(f"this operation needs one of the scopes: {', '.join(sorted(scopes))}")
    return principal


@dataclass(frozen=True, slots=True)
class Reader:
    """A read's caller, by the key its read opens in its own statement (`keyed`)."""

    secret: str
    scopes: frozenset[str]
    # Told the principal once the read's statement opened the key (the request's log line).
    on_open: Callable[[Principal], None] = lambda _: None

    def key_arguments(self) -> tuple[str, str, list[str]]:
        """The first three parameters of a `keyed` statement: key id, digest, scopes."""
        # An unparseable secret names no key ('' matches none), and `opened` refuses it.
        return _key_id_of(self.secret) or "", _digest(self.secret), sorted(self.scopes)

    def open(self, stored: Columns | None) -> Principal:
        """The principal of the key's row a `keyed` statement read; or `Unauthorized`, or
        `Forbidden` when it lacks the scopes."""
        principal = admitted(opened(self.secret, stored), self.scopes)
        self.on_open(principal)
        return principal


class Reads(Protocol):
    """Where a read's rows come from: a statement of `keyed`, which opens the caller's key, run
    on its own; or, for an admin key reading as another tenant, the same work with that tenant
    as $1, run in a transaction that recorded the read first and is scoped to that tenant."""

    async def rows(self, *, keyed: str, scoped: str, arguments: Sequence[object]) -> list[Record]:
        """The rows of the read, the key opened (or `Unauthorized`, `Forbidden`)."""
        ...
