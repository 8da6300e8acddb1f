"""Citations, excerpts and batch resolution over HTTP."""

from __future__ import annotations

from fastapi import APIRouter

from app.access.auth import ReaderKey
from app.citations import service as citations
from app.citations.schemas import ResolveRead, ResolveRequest, resolve_entry
from app.db import SessionDep
from app.errors import INTEGRITY_RESPONSES
from app.grounding.models import Citation, Excerpt, Tombstone
from app.limits import limit_items

router = APIRouter(prefix="/v1/citations", tags=["citations"])


@router.get("/{citation_id}")
async def get_citation(citation_id: str, session: SessionDep, principal: ReaderKey) -> Citation:
    return await citations.get_citation(session, tenant=principal.tenant, citation_id=citation_id)


@router.get("/{citation_id}/excerpt", responses=INTEGRITY_RESPONSES)
async def get_excerpt(
    citation_id: str, session: SessionDep, principal: ReaderKey
) -> Excerpt | Tombstone:
    return await citations.excerpt(session, tenant=principal.tenant, citation_id=citation_id)


@router.post(
    "/resolve",
    responses=INTEGRITY_RESPONSES,
    dependencies=[
        limit_items("citation_ids", what="ids per resolve", limit=lambda s: s.max_resolve_ids)
    ],
)
async def resolve_citations(
    body: ResolveRequest, session: SessionDep, principal: ReaderKey
) -> ResolveRead:
    resolutions = await citations.resolve(
        session, tenant=principal.tenant, citation_ids=body.citation_ids
    )
    return ResolveRead(results=[resolve_entry(r) for r in resolutions])
