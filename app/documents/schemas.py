"""Request and response bodies of the corpus registry."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from app.grounding.models import Identifier

ShortText = Annotated[str, Field(max_length=4096)]


class ChunkCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chunk_id: Identifier
    start: int
    end: int
    page: int | None = None
    section: ShortText | None = None
    uri: ShortText | None = None


class VersionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Identifier
    text: str
    uri: ShortText | None = None
    title: ShortText | None = None
    chunks: list[ChunkCreate]


class VersionRead(BaseModel):
    tenant: str
    document_id: str
    version: str
    sha256: str | None = Field(description="sha256 of the text; null once the version is erased")
    uri: str | None
    title: str | None
    chunk_count: int
    created_at: datetime
    erased_at: datetime | None


class DocumentRead(BaseModel):
    tenant: str
    document_id: str
    versions: list[VersionRead] = Field(description="In registration order")


class ErasureCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=4096)]
    request_ref: Annotated[str, Field(min_length=1, max_length=256)]
    versions: Annotated[list[Identifier], Field(min_length=1)] | None = None


class ErasureRead(BaseModel):
    erasure_id: str
    tenant: str
    document_id: str
    versions: list[str]
    reason: str
    request_ref: str
    erased_at: datetime
