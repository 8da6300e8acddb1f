"""The request's principal: its key opened, its scope checked, its transaction (in a session, or
on the driver) scoped to its tenant.

An admin key reads what the other scopes read, of any tenant it names in `X-Grounding-Tenant`:
the read is recorded in the admin's own audit log first, then the session is scoped to the
named tenant, so row-level security stays on and the admin sees exactly what that tenant would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from asyncpg import Record
from fastapi import Depends, Header, Request
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import db
from app.access import service as access
from app.access.service import Principal, Reader, Reads
from app.audit import service as audit
from app.db import SessionDep, SessionStatements, Statements, TransactionDep, scope_to_tenant
from app.errors import Forbidden, Unauthorized

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

_ACTING_TENANT = TypeAdapter(ActingTenant)


# `ActingTenant` as FastAPI documents the parameter, for a route that reads the header itself
# (`acting_tenant`): the route's `openapi_extra`.
ACTING_TENANT_DOCUMENTED: dict[str, Any] = {
    "parameters": [
        {
            "name": ACTING_TENANT,
            "in": "header",
            "required": False,
            "schema": {**_ACTING_TENANT.json_schema(), "title": ACTING_TENANT.title()},
            "description": _ACTING_TENANT_DESCRIPTION,
        }
    ]
}


def acting_tenant(request: Request) -> str | None:
    """The tenant an admin key names to read as, validated as the `ActingTenant` parameter is:
    for the hot reads, which take it from the headers themselves, as FastAPI's solving of a
    header parameter costs 12 us a request, a sixteenth of an excerpt's."""
    named = request.headers.get(ACTING_TENANT)
    if named is None:
        return None
    try:
        return _ACTING_TENANT.validate_python(named)
    except ValidationError as invalid:
        located = [{**e, "loc": ("header", ACTING_TENANT, *e["loc"])} for e in invalid.errors()]
        raise RequestValidationError(located) from None


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


def require_in_transaction(
    *scopes: str,
) -> Callable[[Request, TransactionDep, ActingTenant], Awaitable[Principal]]:
    """`require`, for writes done in the request's transaction on the driver (`db.Transaction`):
    a write never acts as another tenant."""
    allowed = frozenset(scopes)

    async def authorize(
        request: Request, transaction: TransactionDep, acting: ActingTenant = None
    ) -> Principal:
        principal = await _admitted(request, transaction, allowed)
        if acting is not None and acting != principal.tenant:
            raise _only_admin_reads_act()
        request.state.principal = principal
        return principal

    return authorize


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
    naming a tenant to read as (`acting_tenant`) reads in a transaction that opens it and
    records the read first, as `require` does. The route documents the header with
    `ACTING_TENANT_DOCUMENTED`."""
    secret = _bearer(request)
    acting = acting_tenant(request)
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
# An agent's key on a write done in the request's transaction on the driver.
AgentWriteKey = Annotated[Principal, Depends(require_in_transaction("agent"))]
ReaderKey = Annotated[Principal, Depends(require(*READERS, reads=True))]
# A reader's key, opened by the read's own statement; as a dependency, for a route whose body
# must not be looked at before the key is (a route with no body calls `keyed_reads` itself).
KeyedReads = Annotated[Reads, Depends(_keyed_readers)]
AuditKey = Annotated[Principal, Depends(require("audit", "admin"))]
AdminKey = Annotated[Principal, Depends(require("admin"))]
