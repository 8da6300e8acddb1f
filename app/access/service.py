"""Tenants and API keys.

Invariants kept here:
- a key's secret is shown once, at creation, and stored only as its sha256;
- secrets are compared in constant time, and every way a key can fail to open looks the same;
- a revoked key stops opening on the next request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.errors import InvalidRequest, NotFound, Unauthorized
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
_AUTHENTICATE = text(
    "SELECT tenant, secret_sha256, scopes, revoked_at,"
    " set_config('app.tenant', tenant, true) AS scoped"
    " FROM api_keys WHERE key_id = :key_id"
)


async def authenticate(session: AsyncSession, *, secret: str) -> Principal:
    """The principal `secret` opens, with the transaction scoped to its tenant; or
    `Unauthorized`, which never says why."""
    key_id = _key_id_of(secret)
    row = None
    if key_id is not None:
        row = (await session.execute(_AUTHENTICATE, {"key_id": key_id})).one_or_none()
    expected = row.secret_sha256 if row is not None else _UNKNOWN_KEY_DIGEST
    opens = hmac.compare_digest(_digest(secret), expected)
    if row is None or not opens or row.revoked_at is not None or key_id is None:
        raise Unauthorized("a valid API key is required")
    return Principal(tenant=row.tenant, key_id=key_id, scopes=frozenset(row.scopes))
