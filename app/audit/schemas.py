"""Response bodies of the audit endpoints."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
