"""Audit queries and the integrity check over HTTP."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from app.access.auth import AuditKey
from app.audit import service as audit
from app.audit.schemas import FirstBad, IntegrityRange, IntegrityRead
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
