"""Memory records over HTTP."""

from __future__ import annotations

from fastapi import APIRouter, status

from app.access.auth import AgentKey, ReaderKey
from app.citations.schemas import resolve_entry
from app.db import SessionDep
from app.errors import INTEGRITY_RESPONSES
from app.idempotency.route import Idempotent, IdempotentRoute
from app.limits import limit_items
from app.memory import service as memory
from app.memory.schemas import MemoryCreate, MemoryRead, MemoryWithCitations

router = APIRouter(prefix="/v1/memory", tags=["memory"], route_class=IdempotentRoute)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    # A record's ids are resolved each time it is read: as many as one resolve may ask for.
    dependencies=[
        limit_items("citation_ids", what="citation ids", limit=lambda s: s.max_resolve_ids)
    ],
)
async def remember(
    body: MemoryCreate, session: SessionDep, principal: AgentKey, idempotency: Idempotent
) -> MemoryRead:
    record = await memory.remember(
        session,
        principal=principal,
        text=body.text,
        citation_ids=body.citation_ids,
        verification_id=body.verification_id,
    )
    return MemoryRead.model_validate(record, from_attributes=True)


@router.get("/{memory_id}", responses=INTEGRITY_RESPONSES)
async def get_memory(
    memory_id: str, session: SessionDep, principal: ReaderKey
) -> MemoryWithCitations:
    record, resolved = await memory.get_memory(
        session, tenant=principal.tenant, memory_id=memory_id
    )
    read = MemoryRead.model_validate(record, from_attributes=True)
    return MemoryWithCitations(**read.model_dump(), citations=[resolve_entry(r) for r in resolved])
