"""Request and response bodies of citation reads and resolution."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from app.grounding.models import Excerpt, Identifier, Tombstone


# Named by shape, not imported from the service: the client reuses these bodies and must not
# import the database with them.
class Resolution(Protocol):
    """What one asked-for id resolved to: an excerpt, a tombstone, or nothing."""

    @property
    def citation_id(self) -> str: ...

    @property
    def found(self) -> Excerpt | Tombstone | None: ...


class ResolveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    citation_ids: list[Identifier]


class ResolvedExcerpt(Excerpt):
    status: Literal["excerpt"] = "excerpt"


class ResolvedTombstone(Tombstone):
    status: Literal["tombstone"] = "tombstone"


class Unresolved(BaseModel):
    citation_id: str
    status: Literal["not_found"] = "not_found"


ResolveEntry = Annotated[
    ResolvedExcerpt | ResolvedTombstone | Unresolved, Field(discriminator="status")
]


class ResolveRead(BaseModel):
    results: list[ResolveEntry] = Field(description="One entry per id asked, in the order asked")


def resolve_entry(resolution: Resolution) -> ResolvedExcerpt | ResolvedTombstone | Unresolved:
    """The response entry of one resolution."""
    found = resolution.found
    if isinstance(found, Excerpt):
        return ResolvedExcerpt(**found.model_dump())
    if isinstance(found, Tombstone):
        return ResolvedTombstone(**found.model_dump())
    return Unresolved(citation_id=resolution.citation_id)


def resolve_entry_body(citation_id: str, found: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON of the `ResolveEntry` of one asked-for id, from the body of the excerpt or
    tombstone it resolved to (None: not found), as `resolve_entry` would give it."""
    if found is None:
        return {"citation_id": citation_id, "status": "not_found"}
    return found | {"status": "tombstone" if found["erased"] else "excerpt"}
