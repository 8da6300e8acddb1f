"""Issued citations: reading them, and resolving them to excerpts or tombstones.

Invariants kept here:
- a citation resolves against the version it pinned, never a newer one;
- an excerpt's characters are verified against the citation's `span_sha256` before they leave;
- a citation into an erased version resolves to a tombstone, with no text and no plain hash;
- another tenant's citation is exactly as absent as one that never existed;
- a batch resolves in one statement, whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Text

from app import telemetry
from app.errors import NotFound
from app.grounding.excerpt import ExcerptIntegrityError, citation_attributes
from app.grounding.excerpt import excerpt as pinned_excerpt
from app.grounding.models import Citation, Excerpt, Locator, Span, Tombstone
from app.models import CitationRow


def row_values(citation: Citation, *, ordinal: int, span_hmac: str) -> dict[str, Any]:
    """The `citations` row of an issued citation."""
    return {
        "tenant": citation.tenant,
        "citation_id": citation.citation_id,
        "run_id": citation.run_id,
        "ordinal": ordinal,
        "document_id": citation.document_id,
        "document_version": citation.document_version,
        "chunk_id": citation.chunk_id,
        "span_start": citation.span.start,
        "span_end": citation.span.end,
        "utf8_start": citation.span_utf8.start,
        "utf8_end": citation.span_utf8.end,
        "utf16_start": citation.span_utf16.start,
        "utf16_end": citation.span_utf16.end,
        "score": citation.score,
        "branches": citation.branches,
        "retrieved_at": citation.retrieved_at,
        "uri": citation.locator.uri,
        "page": citation.locator.page,
        "section": citation.locator.section,
        "span_sha256": citation.span_sha256,
        "span_hmac": span_hmac,
    }


def from_row(row: Any) -> Citation:
    """An issued citation from a `citations` row (or any row with its columns)."""
    return Citation(
        citation_id=row.citation_id,
        run_id=row.run_id,
        tenant=row.tenant,
        document_id=row.document_id,
        document_version=row.document_version,
        chunk_id=row.chunk_id,
        span=Span(start=row.span_start, end=row.span_end),
        score=row.score,
        branches=row.branches,
        retrieved_at=row.retrieved_at,
        locator=Locator(uri=row.uri, page=row.page, section=row.section),
        span_sha256=row.span_sha256,
        span_utf8=Span(start=row.utf8_start, end=row.utf8_end),
        span_utf16=Span(start=row.utf16_start, end=row.utf16_end),
    )


async def get_citation(session: AsyncSession, *, tenant: str, citation_id: str) -> Citation:
    """One issued citation of `tenant`, or `NotFound`."""
    row = await session.get(CitationRow, (tenant, citation_id))
    if row is None:
        raise NotFound("no such citation")
    return from_row(row)


async def find_citations(
    session: AsyncSession, *, tenant: str, citation_ids: Iterable[str]
) -> dict[str, Citation]:
    """The issued citations of `tenant` among `citation_ids`, by id."""
    rows = await session.execute(
        select(CitationRow).where(
            CitationRow.tenant == tenant, CitationRow.citation_id.in_(list(citation_ids))
        )
    )
    return {row.citation_id: from_row(row) for row in rows.scalars()}


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one asked-for id resolved to: an excerpt, a tombstone, or nothing (`None`)."""

    citation_id: str
    found: Excerpt | Tombstone | None


_RESOLVE = text(
    """
    SELECT c.*, ch.text AS chunk_text, ch.span_start AS chunk_start,
           v.erased_at, e.request_ref,
           (SELECT n.version FROM document_versions n
             WHERE n.tenant = c.tenant AND n.document_id = c.document_id
               AND n.seq > v.seq AND n.erased_at IS NULL
             ORDER BY n.seq DESC LIMIT 1) AS superseded_by
      FROM citations c
      JOIN document_versions v
        ON v.tenant = c.tenant AND v.document_id = c.document_id
       AND v.version = c.document_version
      LEFT JOIN chunks ch
        ON ch.tenant = c.tenant AND ch.document_id = c.document_id
       AND ch.version = c.document_version AND ch.chunk_id = c.chunk_id
      LEFT JOIN erasures e ON e.tenant = v.tenant AND e.erasure_id = v.erasure_id
     WHERE c.tenant = :tenant AND c.citation_id = ANY(:ids)
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)))


@telemetry.traced("grounding.resolve")
async def resolve(
    session: AsyncSession, *, tenant: str, citation_ids: Sequence[str]
) -> list[Resolution]:
    """One resolution per asked-for id, in the order asked, in one statement."""
    return await _resolve(session, tenant, citation_ids)


async def _resolve(
    session: AsyncSession, tenant: str, citation_ids: Sequence[str]
) -> list[Resolution]:
    rows = (
        await session.execute(_RESOLVE, {"tenant": tenant, "ids": list(set(citation_ids))})
    ).all()
    found = {row.citation_id: _resolved(row) for row in rows}
    resolutions = [Resolution(citation_id=cid, found=found.get(cid)) for cid in citation_ids]
    telemetry.annotate(
        lambda: {
            **citation_attributes(from_row(row) for row in rows),
            "adk.grounding.outcome": "resolved",
            "adk.grounding.requested_count": len(citation_ids),
            "adk.grounding.excerpt_count": sum(isinstance(r.found, Excerpt) for r in resolutions),
            "adk.grounding.tombstone_count": sum(
                isinstance(r.found, Tombstone) for r in resolutions
            ),
            "adk.grounding.not_found_count": sum(r.found is None for r in resolutions),
        }
    )
    return resolutions


def _resolved(row: Any) -> Excerpt | Tombstone:
    citation = from_row(row)
    if row.erased_at is not None:
        return Tombstone(
            citation_id=citation.citation_id,
            document_id=citation.document_id,
            document_version=citation.document_version,
            span=citation.span,
            locator=citation.locator,
            erased_at=row.erased_at,
            request_ref=row.request_ref,
            superseded_by=row.superseded_by,
        )
    if row.chunk_text is None:
        # A live version's chunk always has its text: none (or no chunk row) is tampering.
        raise ExcerptIntegrityError(citation.citation_id)
    return pinned_excerpt(
        citation, row.chunk_text, offset=row.chunk_start, superseded_by=row.superseded_by
    )


@telemetry.traced("grounding.excerpt")
async def excerpt(session: AsyncSession, *, tenant: str, citation_id: str) -> Excerpt | Tombstone:
    """The exact characters one citation pins, or its tombstone, or `NotFound`."""
    [resolution] = await _resolve(session, tenant, [citation_id])
    if resolution.found is None:
        raise NotFound("no such citation")
    return resolution.found
