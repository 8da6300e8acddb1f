"""Request and response bodies of retrieval runs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from app.grounding.cite import RetrievalResult
from app.grounding.models import Citation


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: Annotated[str, Field(max_length=65536)] | None = None
    scope: Annotated[str, Field(max_length=1024)] | None = None
    results: list[RetrievalResult]


class RunRead(BaseModel):
    run_id: str
    tenant: str
    query: str | None
    scope: str | None
    retrieved_at: datetime
    citations: list[Citation] = Field(description="In the order of the run's results")
