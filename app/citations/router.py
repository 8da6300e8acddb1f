"""Citations, excerpts and batch resolution over HTTP."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.access.auth import ACTING_TENANT_HEADER, READERS, KeyedReads, ReaderKey, keyed_reads
from app.bodies import JSONBodyRoute, json_response
from app.citations import service as citations
from app.citations.schemas import ResolveRead, ResolveRequest, resolve_entry_body
from app.db import SessionDep
from app.errors import INTEGRITY_RESPONSES
from app.grounding.models import Citation, Excerpt, Tombstone
from app.headers import documenting
from app.limits import limit_items

router = APIRouter(prefix="/v1/citations", tags=["citations"], route_class=JSONBodyRoute)


@router.get("/{citation_id}")
async def get_citation(citation_id: str, session: SessionDep, principal: ReaderKey) -> Citation:
    return await citations.get_citation(session, tenant=principal.tenant, citation_id=citation_id)


@router.get(
    "/{citation_id}/excerpt",
    response_model=Excerpt | Tombstone,
    responses=INTEGRITY_RESPONSES,
    openapi_extra=documenting(ACTING_TENANT_HEADER),
)
async def get_excerpt(citation_id: str, request: Request) -> Response:
    # Not a dependency (`KeyedReads`): FastAPI's solving of one costs 10 us a request.
    reads = keyed_reads(request, *READERS)
    return json_response(await citations.excerpt(reads, citation_id=citation_id))


@router.post(
    "/resolve",
    response_model=ResolveRead,
    responses=INTEGRITY_RESPONSES,
    openapi_extra=documenting(ACTING_TENANT_HEADER),
    dependencies=[
        limit_items("citation_ids", what="ids per resolve", limit=lambda s: s.max_resolve_ids)
    ],
)
async def resolve_citations(body: ResolveRequest, reads: KeyedReads) -> Response:
    found = await citations.resolve_bodies(reads, citation_ids=body.citation_ids)
    return json_response(
        {"results": [resolve_entry_body(cid, found.get(cid)) for cid in body.citation_ids]}
    )
