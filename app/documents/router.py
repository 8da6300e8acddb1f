"""The corpus registry over HTTP."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Path, Request, Response, status

from app.access.auth import IngestKey, IngestReadKey
from app.config import SettingsDep
from app.db import SessionDep
from app.documents import service as documents
from app.documents.schemas import (
    DocumentRead,
    ErasureCreate,
    ErasureRead,
    VersionCreate,
    VersionRead,
)
from app.errors import problem_response
from app.grounding.models import Identifier
from app.idempotency.route import Idempotent, IdempotentRoute
from app.limits import limit_items

router = APIRouter(prefix="/v1/documents", tags=["documents"], route_class=IdempotentRoute)

# As long as a retrieval result's `document_id` may be, so every registered document is citable.
DocumentId = Annotated[Identifier, Path()]


@router.post(
    "/{document_id}/versions",
    status_code=status.HTTP_201_CREATED,
    dependencies=[
        limit_items("chunks", what="chunks per version", limit=lambda s: s.max_chunks_per_version)
    ],
    responses={
        200: {"model": VersionRead, "description": "The same content was registered before"},
        409: problem_response("`version_conflict`: the version holds other content, or was erased"),
    },
)
async def register_version(
    document_id: DocumentId,
    body: VersionCreate,
    response: Response,
    session: SessionDep,
    principal: IngestKey,
    idempotency: Idempotent,
    settings: SettingsDep,
) -> VersionRead:
    registration = await documents.register_version(
        session, principal=principal, document_id=document_id, body=body, settings=settings
    )
    if not registration.created:
        response.status_code = status.HTTP_200_OK
    return VersionRead.model_validate(registration.version, from_attributes=True)


@router.get("/{document_id}")
async def get_document(
    document_id: DocumentId, session: SessionDep, principal: IngestReadKey
) -> DocumentRead:
    versions = await documents.get_document(session, principal=principal, document_id=document_id)
    return DocumentRead(
        tenant=principal.tenant,
        document_id=document_id,
        versions=[VersionRead.model_validate(v, from_attributes=True) for v in versions],
    )


@router.post("/{document_id}/erase")
async def erase_document(
    document_id: DocumentId,
    body: ErasureCreate,
    request: Request,
    background: BackgroundTasks,
    session: SessionDep,
    principal: IngestKey,
    idempotency: Idempotent,
    settings: SettingsDep,
) -> ErasureRead:
    result = await documents.erase(session, principal=principal, document_id=document_id, body=body)
    if result.created:
        request.app.state.metrics.erasures.inc()
    if documents.commits_for_real(session):
        # Background tasks run after the response, so after the request's transaction commits.
        # Erasing again vacuums again: a way to retry one that was skipped.
        background.add_task(documents.vacuum_after_erasure, settings)
    return ErasureRead.model_validate(result.erasure, from_attributes=True)
