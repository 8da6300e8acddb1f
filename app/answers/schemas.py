"""Request and response bodies of answer verification."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.grounding.models import Citation, Claim


class VerificationPassed(BaseModel):
    verification_id: str
    run_id: str
    outcome: Literal["grounded", "refused"]
    text: str = Field(description="The claims as prose, in order")
    claims: list[Claim]
    provenance: list[str] = Field(description="Every citation id some claim rests on, in first use")
    created_at: datetime


class ClaimRead(BaseModel):
    text: str
    citation_ids: list[str]
    sources: list[Citation] = Field(description="The issued citations the claim names")


class VerificationRead(BaseModel):
    verification_id: str
    run_id: str
    tenant: str
    key_id: str
    outcome: Literal["grounded", "refused", "rejected"]
    code: str | None
    violations: list[dict[str, Any]]
    text: str
    claims: list[ClaimRead]
    provenance: list[str]
    claim_count: int
    citation_count: int
    answer_sha256: str
    created_at: datetime
