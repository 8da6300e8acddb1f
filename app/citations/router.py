"""Citations, excerpts and batch resolution over HTTP."""

from __future__ import annotations

from fastapi import APIRouter

from app.access.auth import ReaderKey
from app.citations import service as citations
from app.citations.schemas import ResolveRead, ResolveRequest, resolve_entry
from app.config import SettingsDep
from app.db import SessionDep
from app.errors import enforce_limit
from app.grounding.models import Citation, Excerpt, Tombstone

router = APIRouter(prefix="/v1/citations", tags=["citations"])


@router.get("/{citation_id}")
async def get_citation(citation_id: str, session: SessionDep, principal: ReaderKey) -> Citation:
    return await citations.get_citation(session, tenant=principal.tenant, citation_id=citation_id)


@router.get("/{citation_id}/excerpt")
async def get_excerpt(
    citation_id: str, session: SessionDep, principal: ReaderKey
) -> Excerpt | Tombstone:
    return await citations.excerpt(session, tenant=principal.tenant, citation_id=citation_id)


@router.post("/resolve")
async def resolve_citations(
    body: ResolveRequest, session: SessionDep, principal: ReaderKey, settings: SettingsDep
) -> ResolveRead:
    enforce_limit("ids per resolve", len(body.citation_ids), settings.max_resolve_ids)
    resolutions = await citations.resolve(
        session, tenant=principal.tenant, citation_ids=body.citation_ids
    )
    return ResolveRead(results=[resolve_entry(r) for r in resolutions])
