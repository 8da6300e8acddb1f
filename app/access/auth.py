"""The request's principal: its key opened, its scope checked, the session scoped to its tenant.

An admin key reads what the other scopes read, of any tenant it names in `X-Grounding-Tenant`:
the read is recorded in the admin's own audit log first, then the session is scoped to the
named tenant, so row-level security stays on and the admin sees exactly what that tenant would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.access import service as access
from app.access.service import Principal, Reader
from app.audit import service as audit
from app.db import SessionDep, scope_to_tenant
from app.errors import Forbidden, Unauthorized

ACTING_TENANT = "x-grounding-tenant"


ActingTenant = Annotated[
    str | None,
    Header(
        alias=ACTING_TENANT,
        description="Admin keys, on reads: read as this tenant (the read is audited)",
        max_length=128,
    ),
]


def require(
    *scopes: str, reads: bool = False
) -> Callable[[Request, SessionDep, ActingTenant], Awaitable[Principal]]:
    """A dependency that admits a key holding any of `scopes`; on `reads`, an admin key may act
    as the tenant it names."""
    allowed = frozenset(scopes)

    async def authorize(
        request: Request, session: SessionDep, acting: ActingTenant = None
    ) -> Principal:
        principal = await access.authenticate(session, secret=_bearer(request))
        access.admitted(principal, allowed)
        if acting is not None and acting != principal.tenant:
            principal = await _act_as(request, session, principal, acting, reads=reads)
        request.state.principal = principal
        return principal

    return authorize


def _bearer(request: Request) -> str:
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("a valid API key is required")
    return secret.strip()


def read_keyed(*scopes: str) -> Callable[[Request, SessionDep, ActingTenant], Awaitable[Reader]]:
    """A dependency for reads that open their key in their own statement (`access.keyed`):
    one round trip for the whole request. An admin key naming a tenant to read as is opened
    here instead, its read audited first, as `require` does."""
    allowed = frozenset(scopes)
    authorize = require(*scopes, reads=True)

    async def reader(request: Request, session: SessionDep, acting: ActingTenant = None) -> Reader:
        secret = _bearer(request)
        if acting is not None:
            principal = await authorize(request, session, acting)
            return Reader(secret=secret, scopes=allowed, principal=principal)

        def on_open(principal: Principal) -> None:
            request.state.principal = principal

        return Reader(secret=secret, scopes=allowed, on_open=on_open)

    return reader


async def _act_as(
    request: Request, session: AsyncSession, admin: Principal, tenant: str, *, reads: bool
) -> Principal:
    if not reads or "admin" not in admin.scopes:
        raise Forbidden(
            f"only an admin key reads as another tenant, and only reads ({ACTING_TENANT})"
        )
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
KeyedReader = Annotated[Reader, Depends(read_keyed(*READERS))]
AuditKey = Annotated[Principal, Depends(require("audit", "admin"))]
AdminKey = Annotated[Principal, Depends(require("admin"))]
