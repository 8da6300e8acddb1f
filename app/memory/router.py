"""Memory records over HTTP."""

from __future__ import annotations

from fastapi import APIRouter, status

from app.access.auth import AgentKey, ReaderKey
from app.citations.schemas import resolve_entry
from app.db import SessionDep
from app.memory import service as memory
from app.memory.schemas import MemoryCreate, MemoryRead, MemoryWithCitations

router = APIRouter(prefix="/v1/memory", tags=["memory"])


@router.post("", status_code=status.HTTP_201_CREATED)
async def remember(body: MemoryCreate, session: SessionDep, principal: AgentKey) -> MemoryRead:
    record = await memory.remember(
        session,
        principal=principal,
        text=body.text,
        citation_ids=body.citation_ids,
        verification_id=body.verification_id,
    )
    return MemoryRead.model_validate(record, from_attributes=True)


@router.get("/{memory_id}")
async def get_memory(
    memory_id: str, session: SessionDep, principal: ReaderKey
) -> MemoryWithCitations:
    record, resolved = await memory.get_memory(
        session, tenant=principal.tenant, memory_id=memory_id
    )
    read = MemoryRead.model_validate(record, from_attributes=True)
    return MemoryWithCitations(**read.model_dump(), citations=[resolve_entry(r) for r in resolved])
