"""The request's principal: its key opened, its scope checked, its transaction (in a session, or
on the driver) scoped to its tenant.

An admin key reads what the other scopes read, of any tenant it names in `X-Grounding-Tenant`:
the read is recorded in the admin's own audit log first, then the session is scoped to the
named tenant, so row-level security stays on and the admin sees exactly what that tenant would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated

from asyncpg import Record
from fastapi import Depends, Header, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import db
from app.access import service as access
from app.access.service import Principal, Reader, Reads
from app.audit import service as audit
from app.db import SessionDep, SessionStatements, Statements, Transaction, scope_to_tenant
from app.errors import Forbidden, Unauthorized
from app.headers import HandReadHeader

ACTING_TENANT = "x-grounding-tenant"
_ACTING_TENANT_DESCRIPTION = "Admin keys, on reads: read as this tenant (the read is audited)"

ActingTenant = Annotated[
    str | None,
    Header(
        alias=ACTING_TENANT,
        description=_ACTING_TENANT_DESCRIPTION,
        max_length=128,
    ),
]

# For the hot routes, which read it themselves (`app.headers`).
ACTING_TENANT_HEADER = HandReadHeader(ActingTenant)


def require(
    *scopes: str, reads: bool = False
) -> Callable[[Request, SessionDep, ActingTenant], Awaitable[Principal]]:
    """A dependency that admits a key holding any of `scopes`; on `reads`, an admin key may act
    as the tenant it names."""
    allowed = frozenset(scopes)

    async def authorize(
        request: Request, session: SessionDep, acting: ActingTenant = None
    ) -> Principal:
        principal = await _admitted(request, SessionStatements(session), allowed)
        if acting is not None and acting != principal.tenant:
            principal = await _act_as(request, session, principal, acting, reads=reads)
        request.state.principal = principal
        return principal

    return authorize


async def admit_in_transaction(
    request: Request, transaction: Transaction, scopes: frozenset[str]
) -> Principal:
    """`require`, for a write done in the request's transaction on the driver (`db.Transaction`):
    the key's statement scopes that transaction to its tenant. A write never acts as another
    tenant; the header naming one (`ACTING_TENANT_HEADER`) is read here, not declared."""
    acting = ACTING_TENANT_HEADER.read(request)
    principal = await _admitted(request, transaction, scopes)
    if acting is not None and acting != principal.tenant:
        raise _only_admin_reads_act()
    request.state.principal = principal
    return principal


async def _admitted(request: Request, statements: Statements, scopes: frozenset[str]) -> Principal:
    principal = await access.authenticate(statements, secret=_bearer(request))
    return access.admitted(principal, scopes)


def _bearer(request: Request) -> str:
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("a valid API key is required")
    return secret.strip()


def keyed_reads(request: Request, *scopes: str) -> Reads:
    """Where the rows of a read come from when it opens its key in its own statement
    (`access.keyed`): one round trip for the whole request, with no session. An admin key
    naming a tenant to read as (`ACTING_TENANT_HEADER`) reads in a transaction that opens it
    and records the read first, as `require` does. The route documents the header with
    `documenting(ACTING_TENANT_HEADER)`."""
    secret = _bearer(request)
    acting = ACTING_TENANT_HEADER.read(request)
    if acting is not None:
        authorize = require(*scopes, reads=True)
        return _ActingReads(request=request, authorize=authorize, acting=acting)

    def on_open(principal: Principal) -> None:
        request.state.principal = principal

    return _KeyedReads(request=request, reader=Reader(secret, frozenset(scopes), on_open))


async def _keyed_readers(request: Request) -> Reads:
    return keyed_reads(request, *READERS)


@dataclass(frozen=True, slots=True)
class _KeyedReads:
    request: Request
    reader: Reader

    async def rows(self, *, keyed: str, scoped: str, arguments: Sequence[object]) -> list[Record]:
        rows = await db.read(self.request, keyed, *self.reader.key_arguments(), *arguments)
        # Refused here, before any row is looked at, when the key does not open.
        self.reader.open(rows[0] if rows else None)
        return rows


@dataclass(frozen=True, slots=True)
class _ActingReads:
    request: Request
    authorize: Callable[[Request, AsyncSession, str | None], Awaitable[Principal]]
    acting: str

    async def rows(self, *, keyed: str, scoped: str, arguments: Sequence[object]) -> list[Record]:
        # The read's own transaction, committed before the response as the request's would be.
        sessionmaker: async_sessionmaker[AsyncSession] = self.request.app.state.sessionmaker
        async with sessionmaker() as session, session.begin():
            principal = await self.authorize(self.request, session, self.acting)
            return await db.fetch(session, scoped, principal.tenant, *arguments)


def _only_admin_reads_act() -> Forbidden:
    return Forbidden(f"only an admin key reads as another tenant, and only reads ({ACTING_TENANT})")


async def _act_as(
    request: Request, session: AsyncSession, admin: Principal, tenant: str, *, reads: bool
) -> Principal:
    if not reads or "admin" not in admin.scopes:
        raise _only_admin_reads_act()
    await audit.record_admin_read(
        session,
        tenant=admin.tenant,
        key_id=admin.key_id,
        route=f"{request.method} {request.url.path}",
        filters={"tenant": tenant},
    )
    await scope_to_tenant(session, tenant)
    return Principal(tenant=tenant, key_id=admin.key_id, scopes=frozenset({"admin"}))


READERS = ("agent", "support", "admin")

IngestKey = Annotated[Principal, Depends(require("ingest"))]
IngestReadKey = Annotated[Principal, Depends(require("ingest", "admin", reads=True))]
AgentKey = Annotated[Principal, Depends(require("agent"))]
ReaderKey = Annotated[Principal, Depends(require(*READERS, reads=True))]
# A reader's key, opened by the read's own statement; as a dependency, for a route whose body
# must not be looked at before the key is (a route with no body calls `keyed_reads` itself).
KeyedReads = Annotated[Reads, Depends(_keyed_readers)]
AuditKey = Annotated[Principal, Depends(require("audit", "admin"))]
AdminKey = Annotated[Principal, Depends(require("admin"))]
