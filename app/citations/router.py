"""Citations, excerpts and batch resolution over HTTP."""

from __future__ import annotations

from typing import Any

import pydantic_core
from fastapi import APIRouter, Response

from app.access.auth import KeyedReads, ReaderKey
from app.citations import service as citations
from app.citations.schemas import ResolveRead, ResolveRequest, resolve_entry_body
from app.db import SessionDep
from app.errors import INTEGRITY_RESPONSES
from app.grounding.models import Citation, Excerpt, Tombstone
from app.limits import limit_items

router = APIRouter(prefix="/v1/citations", tags=["citations"])


def _json(body: Any) -> Response:
    # Bodies the service built field for field from its schema: validating them again as the
    # response model would cost more than the read.
    return Response(pydantic_core.to_json(body), media_type="application/json")


@router.get("/{citation_id}")
async def get_citation(citation_id: str, session: SessionDep, principal: ReaderKey) -> Citation:
    return await citations.get_citation(session, tenant=principal.tenant, citation_id=citation_id)


@router.get(
    "/{citation_id}/excerpt",
    response_model=Excerpt | Tombstone,
    responses=INTEGRITY_RESPONSES,
)
async def get_excerpt(citation_id: str, reads: KeyedReads) -> Response:
    return _json(await citations.excerpt(reads, citation_id=citation_id))


@router.post(
    "/resolve",
    response_model=ResolveRead,
    responses=INTEGRITY_RESPONSES,
    dependencies=[
        limit_items("citation_ids", what="ids per resolve", limit=lambda s: s.max_resolve_ids)
    ],
)
async def resolve_citations(body: ResolveRequest, reads: KeyedReads) -> Response:
    found = await citations.resolve_bodies(reads, citation_ids=body.citation_ids)
    return _json(
        {"results": [resolve_entry_body(cid, found.get(cid)) for cid in body.citation_ids]}
    )
