"""Memory records: text written back to memory keeps the citations it came from.

Invariants kept here:
- a record rests on at least one citation, and every one is an issued citation of its tenant;
- a record made from a verification takes that verification's provenance, and only a grounded
  verification has provenance to give.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.access.service import Principal
from app.answers import service as answers
from app.citations import service as citations
from app.errors import NotFound
from app.grounding.errors import UncitedClaimError, UngroundedCitationError
from app.ids import new_id
from app.models import MemoryCitation, MemoryRecord


async def _provenance(session: AsyncSession, tenant: str, verification_id: str) -> list[str]:
    verification = await answers.find_verification(
        session, tenant=tenant, verification_id=verification_id
    )
    if verification is None:
        raise NotFound("no such verification")
    if verification.outcome != "grounded":
        raise UngroundedCitationError(
            f"the verification was {verification.outcome}, not grounded",
            violations=[
                {
                    "class": "ungrounded_citation",
                    "detail": "only a grounded verification gives provenance",
                }
            ],
        )
    return list(verification.provenance)


async def remember(
    session: AsyncSession,
    *,
    principal: Principal,
    text: str,
    citation_ids: list[str] | None,
    verification_id: str | None,
) -> MemoryRecord:
    """Record `text` with the citations it rests on, or reject it as ungrounded."""
    tenant = principal.tenant
    if verification_id is not None:
        citation_ids = await _provenance(session, tenant, verification_id)
    ids = list(dict.fromkeys(citation_ids or ()))
    if not ids:
        raise UncitedClaimError(
            "a memory record must rest on at least one citation",
            violations=[{"class": "uncited_claim", "detail": "no citation ids"}],
        )
    found = await citations.find_citations(session, tenant=tenant, citation_ids=ids)
    missing = [cid for cid in ids if cid not in found]
    if missing:
        raise UngroundedCitationError(
            "some citation ids were not issued to this tenant",
            violations=[
                {
                    "class": "ungrounded_citation",
                    "missing": missing,
                    "available": [cid for cid in ids if cid in found],
                    "detail": "these citation ids were not issued",
                }
            ],
        )
    record = MemoryRecord(
        tenant=tenant,
        memory_id=new_id("mem"),
        text=text,
        citation_ids=ids,
        verification_id=verification_id,
        key_id=principal.key_id,
        created_at=datetime.now(UTC),
    )
    session.add(record)
    await session.flush()
    await session.execute(
        insert(MemoryCitation),
        [{"tenant": tenant, "memory_id": record.memory_id, "citation_id": cid} for cid in ids],
    )
    return record


async def get_memory(
    session: AsyncSession, *, tenant: str, memory_id: str
) -> tuple[MemoryRecord, list[citations.Resolution]]:
    """A memory record of `tenant` with its citations resolved, tombstones included."""
    record = await session.get(MemoryRecord, (tenant, memory_id))
    if record is None:
        raise NotFound("no such memory record")
    resolved = await citations.resolve(session, tenant=tenant, citation_ids=record.citation_ids)
    return record, resolved
