"""Audit queries and the integrity check over HTTP.

An audit key reads its own tenant; an admin key reads every tenant, and each such read is
recorded in the admin's own audit log before it runs.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.access.auth import AuditKey
from app.audit import queries
from app.audit import service as audit
from app.audit.schemas import (
    AuditParams,
    BlastRadiusParams,
    BlastRadiusRead,
    ErasureAuditRead,
    ErasureFilters,
    FirstBad,
    IntegrityRange,
    IntegrityRead,
    Page,
    RunAuditDetail,
    RunAuditRead,
    RunFilters,
    StatsParams,
    StatsRead,
    VerificationAuditRead,
    VerificationFilters,
)
from app.db import SessionDep

router = APIRouter(prefix="/v1/audit", tags=["audit"])

_CHECKED = [
    "every record's content hash, recomputed from its table",
    "every entry's hash against the checkpoint that sealed it",
    "every checkpoint's Merkle root and its link to the checkpoint before",
]


@router.get("/integrity")
async def check_integrity(session: SessionDep, principal: AuditKey) -> IntegrityRead:
    report = await audit.verify(session, tenant=principal.tenant)
    return IntegrityRead(
        ok=report.ok,
        tenant=principal.tenant,
        entries=report.entries,
        sealed_entries=report.sealed_entries,
        checkpoints=report.checkpoints,
        range=IntegrityRange(first_seq=report.first_seq, last_seq=report.last_seq),
        head=report.head,
        checked=_CHECKED,
        first_bad=FirstBad(**asdict(report.first_bad)) if report.first_bad else None,
    )


@router.get("/runs")
async def list_audit_runs(
    filters: Annotated[RunFilters, Query()],
    request: Request,
    session: SessionDep,
    principal: AuditKey,
) -> Page[RunAuditRead]:
    return await queries.list_runs(
        session, reader=principal, filters=filters, route=request.url.path
    )


@router.get("/runs/{run_id}")
async def get_audit_run(
    run_id: str,
    params: Annotated[AuditParams, Query()],
    request: Request,
    session: SessionDep,
    principal: AuditKey,
) -> RunAuditDetail:
    return await queries.get_run(
        session, reader=principal, run_id=run_id, params=params, route=request.url.path
    )


@router.get("/verifications")
async def list_audit_verifications(
    filters: Annotated[VerificationFilters, Query()],
    request: Request,
    session: SessionDep,
    principal: AuditKey,
) -> Page[VerificationAuditRead]:
    return await queries.list_verifications(
        session, reader=principal, filters=filters, route=request.url.path
    )


@router.get("/erasures")
async def list_audit_erasures(
    filters: Annotated[ErasureFilters, Query()],
    request: Request,
    session: SessionDep,
    principal: AuditKey,
) -> Page[ErasureAuditRead]:
    return await queries.list_erasures(
        session, reader=principal, filters=filters, route=request.url.path
    )


@router.get("/stats")
async def get_audit_stats(
    params: Annotated[StatsParams, Query()],
    request: Request,
    session: SessionDep,
    principal: AuditKey,
) -> StatsRead:
    return await queries.stats(session, reader=principal, params=params, route=request.url.path)


@router.get("/citations")
async def get_blast_radius(
    params: Annotated[BlastRadiusParams, Query()],
    request: Request,
    session: SessionDep,
    principal: AuditKey,
) -> BlastRadiusRead:
    return await queries.blast_radius(
        session, reader=principal, params=params, route=request.url.path
    )
