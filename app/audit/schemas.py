"""Query parameters and response bodies of the audit endpoints.

Audit bodies carry ids, tenants, keys, times, outcomes, codes and counts: never document text,
memory text, claims, or plain span hashes.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Generic, Literal, Self, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from app.grounding.models import Span

DEFAULT_PAGE = 100
MAX_PAGE = 1000

Name = Annotated[str, Field(min_length=1, max_length=256)]
Cursor = Annotated[
    str,
    Field(
        min_length=1,
        max_length=2048,
        description="`next_cursor` of the previous page; the same filters must be sent with it",
    ),
]
Outcome = Literal["grounded", "refused", "rejected"]


class FirstBad(BaseModel):
    seq: int = Field(description="Sequence number of the first entry that does not verify")
    problem: str = Field(
        description=(
            "entry_deleted, entry_inserted, entry_altered, record_deleted, record_altered"
            " or checkpoint_altered"
        )
    )
    kind: str | None = None
    record_id: str | None = None


class IntegrityRange(BaseModel):
    first_seq: int | None
    last_seq: int | None


class IntegrityRead(BaseModel):
    ok: bool
    tenant: str
    entries: int = Field(description="Audit entries checked, sealed or not")
    sealed_entries: int = Field(description="Entries sealed in checkpoints")
    checkpoints: int
    range: IntegrityRange
    head: str = Field(description="Hash of the newest checkpoint: publish it to pin the log")
    checked: list[str] = Field(description="What was recomputed")
    first_bad: FirstBad | None


class AuditParams(BaseModel):
    """What every audit read takes: the tenant to read (admin keys read every tenant)."""

    model_config = ConfigDict(extra="forbid")

    tenant: Name | None = Field(
        default=None,
        description=(
            "Only this tenant's rows. Admin keys read every tenant; an audit key reads only its"
            " own, so another name matches nothing"
        ),
    )


class WindowParams(AuditParams):
    since: AwareDatetime | None = Field(default=None, description="From this time, inclusive")
    until: AwareDatetime | None = Field(default=None, description="Up to this time, exclusive")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until must be after since")
        return self


class PageParams(WindowParams):
    cursor: Cursor | None = None
    limit: int = Field(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="Items per page")


class RunFilters(PageParams):
    run_id: Name | None = None
    document_id: Name | None = Field(default=None, description="Runs citing this document")
    key_id: Name | None = Field(default=None, description="Runs recorded with this key")


class VerificationFilters(PageParams):
    outcome: Outcome | None = None
    code: Name | None = Field(default=None, description="The error code of rejected attempts")
    run_id: Name | None = None
    document_id: Name | None = Field(
        default=None, description="Verifications whose claims rest on a citation of it"
    )
    key_id: Name | None = Field(default=None, description="Verifications submitted with this key")


class ErasureFilters(PageParams):
    document_id: Name | None = Field(default=None, description="Erasures of this document")
    key_id: Name | None = Field(default=None, description="Erasures requested with this key")


class StatsParams(WindowParams):
    pass


class BlastRadiusParams(AuditParams):
    document_id: Name
    version: Name | None = Field(default=None, description="One version; unset, every version")
    cursor: Cursor | None = None
    limit: int = Field(
        default=DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="Items per page of each list"
    )


class RunAuditRead(BaseModel):
    run_id: str
    tenant: str
    key_id: str
    query: str | None
    scope: str | None
    retrieved_at: datetime
    citation_count: int


class VerificationAuditRead(BaseModel):
    verification_id: str
    run_id: str
    tenant: str
    key_id: str
    outcome: Outcome
    code: str | None = Field(description="The first failing class of a rejected attempt")
    claim_count: int
    citation_count: int
    violation_count: int
    created_at: datetime


class ErasureAuditRead(BaseModel):
    erasure_id: str
    tenant: str
    document_id: str
    versions: list[str]
    request_ref: str
    key_id: str
    erased_at: datetime


class MemoryAuditRead(BaseModel):
    memory_id: str
    tenant: str
    key_id: str
    verification_id: str | None
    citation_count: int
    created_at: datetime


Item = TypeVar("Item", bound=BaseModel)


class Page(BaseModel, Generic[Item]):
    items: list[Item] = Field(description="Newest first")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end"
    )


class AuditCitationRead(BaseModel):
    citation_id: str
    ordinal: int = Field(description="Its place among the run's results")
    document_id: str
    document_version: str
    chunk_id: str
    span: Span
    score: float | None
    erased: bool = Field(description="Whether the cited version has been erased")
    erased_at: datetime | None
    erasure_id: str | None


class RunAuditDetail(RunAuditRead):
    citations: list[AuditCitationRead] = Field(description="In the order of the run's results")
    verifications: list[VerificationAuditRead] = Field(description="Every attempt, newest first")


class OutcomeCount(BaseModel):
    day: date = Field(description="UTC day")
    tenant: str
    outcome: Outcome
    code: str | None
    count: int


class StatsRead(BaseModel):
    since: datetime | None
    until: datetime | None
    items: list[OutcomeCount] = Field(
        description="Verifications by day, tenant, outcome and code; newest day first"
    )


class BlastRadiusRead(BaseModel):
    document_id: str
    version: str | None
    verifications: list[VerificationAuditRead] = Field(
        description="Verifications resting on the source: grounded ones first, then newest first"
    )
    memory_records: list[MemoryAuditRead] = Field(
        description="Memory records resting on the source, newest first"
    )
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page of both lists; null when both ended"
    )
