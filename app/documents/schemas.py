"""Request and response bodies of the corpus registry."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.grounding.models import Identifier

ShortText = Annotated[str, Field(max_length=4096)]
# The range of the column a page is stored in.
Page = Annotated[int, Field(ge=0, le=2**31 - 1)]


def _storable(text: str) -> str:
    # PostgreSQL text holds no NUL, and a lone surrogate has no UTF-8 bytes to hash or store.
    if "\x00" in text:
        raise ValueError("the text holds a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text holds a lone surrogate") from None
    return text


class ChunkCreate(BaseModel):
    # Offsets are JSON integers: "12", 12.0 or true are refused rather than coerced.
    model_config = ConfigDict(extra="forbid", strict=True)

    chunk_id: Identifier
    start: int
    end: int
    page: Page | None = None
    section: ShortText | None = None
    uri: ShortText | None = None


class VersionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Identifier
    text: Annotated[str, AfterValidator(_storable)]
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
    versions: Annotated[list[Identifier], Field(min_length=1, max_length=1000)] | None = None


class ErasureRead(BaseModel):
    erasure_id: str
    tenant: str
    document_id: str
    versions: list[str]
    reason: str
    request_ref: str
    erased_at: datetime
