"""Request and response bodies of the admin endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Scope = Literal["ingest", "agent", "support", "audit", "admin"]
TenantName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TenantName


class TenantRead(BaseModel):
    name: str
    created_at: datetime


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: TenantName
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=16)]


class KeyRead(BaseModel):
    key_id: str
    tenant: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


class KeyCreated(KeyRead):
    secret: str = Field(description="The key's secret; shown only in this response")
