"""Request and response bodies of memory records."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.citations.schemas import ResolveEntry
from app.grounding.models import Identifier


class MemoryCreate(BaseModel):
    """Text with the citations it came from: named directly, or a verification's provenance."""

    model_config = ConfigDict(extra="forbid")

    text: Annotated[str, Field(min_length=1, max_length=1_048_576)]
    citation_ids: list[Identifier] | None = None
    verification_id: Identifier | None = None

    @model_validator(mode="after")
    def _one_source(self) -> MemoryCreate:
        if (self.citation_ids is None) == (self.verification_id is None):
            raise ValueError("give exactly one of citation_ids and verification_id")
        return self


class MemoryRead(BaseModel):
    memory_id: str
    text: str
    citation_ids: list[str]
    verification_id: str | None
    created_at: datetime


class MemoryWithCitations(MemoryRead):
    citations: list[ResolveEntry] = Field(description="One resolve entry per citation id")
