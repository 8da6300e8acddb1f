"""The request's principal: its key opened, its scope checked, the session scoped to its tenant."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request

from app.access import service as access
from app.access.service import Principal
from app.db import SessionDep, scope_to_tenant
from app.errors import Forbidden, Unauthorized


def require(*scopes: str) -> Callable[[Request, SessionDep], Awaitable[Principal]]:
    """A dependency that admits a key holding any of `scopes` (admin reads what others read)."""
    allowed = frozenset(scopes)

    async def authorize(request: Request, session: SessionDep) -> Principal:
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthorized("a valid API key is required")
        principal = await access.authenticate(session, secret=secret.strip())
        if not principal.scopes & allowed:
            raise Forbidden(f"this operation needs one of the scopes: {', '.join(sorted(allowed))}")
        await scope_to_tenant(session, principal.tenant)
        request.state.principal = principal
        return principal

    return authorize


READERS = ("agent", "support", "admin")

IngestKey = Annotated[Principal, Depends(require("ingest"))]
IngestReadKey = Annotated[Principal, Depends(require("ingest", "admin"))]
AgentKey = Annotated[Principal, Depends(require("agent"))]
ReaderKey = Annotated[Principal, Depends(require(*READERS))]
AuditKey = Annotated[Principal, Depends(require("audit", "admin"))]
AdminKey = Annotated[Principal, Depends(require("admin"))]
