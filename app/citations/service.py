"""Issued citations: reading them, and resolving them to excerpts or tombstones.

Invariants kept here:
- a citation resolves against the version it pinned, never a newer one;
- an excerpt's characters are verified against the citation's `span_sha256` before they leave;
- a citation into an erased version resolves to a tombstone, with no text and no plain hash;
- another tenant's citation is exactly as absent as one that never existed;
- a batch resolves in one statement, whatever its size; a read by a key that the statement
  opens itself (`access.keyed`) is that one statement and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from asyncpg import Record
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app import db, telemetry
from app.access import service as access
from app.access.service import Reads
from app.db import Columns
from app.errors import NotFound
from app.grounding.excerpt import ExcerptIntegrityError, citation_attributes, exact_characters
from app.grounding.models import Citation, Excerpt, Tombstone
from app.models import CitationRow


def row_values(citation: Mapping[str, Any], *, ordinal: int, span_hmac: str) -> dict[str, Any]:
    """The `citations` row of an issued citation, given as its fields (`cite.issue`)."""
    span, utf8, utf16, locator = (
        citation["span"],
        citation["span_utf8"],
        citation["span_utf16"],
        citation["locator"],
    )
    return {
        "tenant": citation["tenant"],
        "citation_id": citation["citation_id"],
        "run_id": citation["run_id"],
        "ordinal": ordinal,
        "document_id": citation["document_id"],
        "document_version": citation["document_version"],
        "chunk_id": citation["chunk_id"],
        "span_start": span["start"],
        "span_end": span["end"],
        "utf8_start": utf8["start"],
        "utf8_end": utf8["end"],
        "utf16_start": utf16["start"],
        "utf16_end": utf16["end"],
        "score": citation["score"],
        "branches": citation["branches"],
        "retrieved_at": citation["retrieved_at"],
        "uri": locator["uri"],
        "page": locator["page"],
        "section": locator["section"],
        "span_sha256": citation["span_sha256"],
        "span_hmac": span_hmac,
    }


def from_row(row: Columns) -> Citation:
    """An issued citation from a `citations` row, or any row with its columns, by name."""
    # Validated from plain values in one call: a third cheaper than building each nested model.
    return Citation.model_validate(
        {
            "citation_id": row["citation_id"],
            "run_id": row["run_id"],
            "tenant": row["tenant"],
            "document_id": row["document_id"],
            "document_version": row["document_version"],
            "chunk_id": row["chunk_id"],
            "span": {"start": row["span_start"], "end": row["span_end"]},
            "score": row["score"],
            "branches": row["branches"],
            "retrieved_at": row["retrieved_at"],
            "locator": {"uri": row["uri"], "page": row["page"], "section": row["section"]},
            "span_sha256": row["span_sha256"],
            "span_utf8": {"start": row["utf8_start"], "end": row["utf8_end"]},
            "span_utf16": {"start": row["utf16_start"], "end": row["utf16_end"]},
        }
    )


async def get_citation(session: AsyncSession, *, tenant: str, citation_id: str) -> Citation:
    """One issued citation of `tenant`, or `NotFound`."""
    rows = await session.execute(
        select(CitationRow.__table__).where(
            CitationRow.tenant == tenant, CitationRow.citation_id == citation_id
        )
    )
    row = rows.mappings().one_or_none()
    if row is None:
        raise NotFound("no such citation")
    return from_row(row)


async def find_citations(
    session: AsyncSession, *, tenant: str, citation_ids: Iterable[str]
) -> dict[str, Citation]:
    """The issued citations of `tenant` among `citation_ids`, by id."""
    rows = await session.execute(
        select(CitationRow.__table__).where(
            CitationRow.tenant == tenant, CitationRow.citation_id.in_(list(citation_ids))
        )
    )
    return {row["citation_id"]: from_row(row) for row in rows.mappings()}


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one asked-for id resolved to: an excerpt, a tombstone, or nothing (`None`)."""

    citation_id: str
    found: Excerpt | Tombstone | None


# The resolve statement's columns: `_body` reads a row's last ones by position (a third of the
# cost of reading them by name), after the key's columns when the statement opens its key.
_RESOLVED_WIDTH = 14


def _resolve_statement(*, tenant: str, ids: str) -> str:
    """The one statement resolving a batch, given how it names its tenant and its ids.

    Each citation's version, chunk and erasure are looked up by their keys, one citation at a
    time (`LATERAL`, with `OFFSET 0` so that the planner cannot turn it back into a join). The
    plan is generic (`db.StatementPool`): it knows neither the tenant nor how many ids there
    are, and, left to join freely, it hashed or merged every version of the tenant on every
    read, a cost that grew with the tenant's documents: an excerpt's database CPU went from
    0.11 to 0.33 ms once its tenant had registered 670 versions more.
    """
    return f"""
    SELECT c.citation_id, c.document_id, c.document_version, c.span_start, c.span_end,
           c.uri, c.page, c.section, c.span_sha256,
           ch.text AS chunk_text, ch.span_start AS chunk_start,
           v.erased_at, e.request_ref,
           CASE WHEN newest.seq > v.seq THEN newest.version END AS superseded_by
      FROM citations c
      CROSS JOIN LATERAL (
        SELECT v.seq, v.erased_at, v.erasure_id FROM document_versions v
         WHERE v.tenant = c.tenant AND v.document_id = c.document_id
           AND v.version = c.document_version
        OFFSET 0
      ) v
      LEFT JOIN LATERAL (
        SELECT ch.text, ch.span_start FROM chunks ch
         WHERE ch.tenant = c.tenant AND ch.document_id = c.document_id
           AND ch.version = c.document_version AND ch.chunk_id = c.chunk_id
        OFFSET 0
      ) ch ON true
      LEFT JOIN LATERAL (
        SELECT e.request_ref FROM erasures e
         WHERE e.tenant = c.tenant AND e.erasure_id = v.erasure_id
        OFFSET 0
      ) e ON true
      -- The newest live version depends on the document alone, not on the cited version, so
      -- PostgreSQL can memoize it per document when a batch cites a document more than once.
      LEFT JOIN LATERAL (
        SELECT n.version, n.seq FROM document_versions n
         WHERE n.tenant = c.tenant AND n.document_id = c.document_id AND n.erased_at IS NULL
         ORDER BY n.seq DESC LIMIT 1
      ) newest ON true
     WHERE c.tenant = {tenant} AND c.citation_id = ANY({ids}::text[])
    """


# As the tenant the transaction is scoped to; and as the key the statement opens itself.
_RESOLVE = _resolve_statement(tenant="$1", ids="$2")
_RESOLVE_KEYED = access.keyed(_resolve_statement(tenant="key.scoped", ids="$4"))

Body = dict[str, Any]


@telemetry.traced("grounding.resolve")
async def resolve(
    session: AsyncSession, *, tenant: str, citation_ids: Sequence[str]
) -> list[Resolution]:
    """One resolution per asked-for id, in the order asked, in one statement, in a transaction
    already scoped to `tenant`."""
    rows = await db.fetch(session, _RESOLVE, tenant, list(dict.fromkeys(citation_ids)))
    found = _bodies(rows, citation_ids)
    return [
        Resolution(citation_id=cid, found=_model(found[cid]) if cid in found else None)
        for cid in citation_ids
    ]


@telemetry.traced("grounding.resolve")
async def resolve_bodies(reads: Reads, *, citation_ids: Sequence[str]) -> dict[str, Body]:
    """The excerpt or tombstone body (the JSON of `Excerpt` or `Tombstone`) of each asked-for
    id found, by id, in one statement that also opens the reader's key."""
    return await _read_bodies(reads, citation_ids)


@telemetry.traced("grounding.excerpt")
async def excerpt(reads: Reads, *, citation_id: str) -> Body:
    """The body of the exact characters one citation pins, or of its tombstone; or
    `NotFound`."""
    found = await _read_bodies(reads, [citation_id])
    if citation_id not in found:
        raise NotFound("no such citation")
    return found[citation_id]


async def _read_bodies(reads: Reads, citation_ids: Sequence[str]) -> dict[str, Body]:
    unique = list(dict.fromkeys(citation_ids))
    rows = await reads.rows(keyed=_RESOLVE_KEYED, scoped=_RESOLVE, arguments=(unique,))
    # A keyed statement that found nothing still reads the key's row, with no citation.
    return _bodies([row for row in rows if row[-_RESOLVED_WIDTH] is not None], citation_ids)


def _bodies(rows: Sequence[Record], citation_ids: Sequence[str]) -> dict[str, Body]:
    found = {body["citation_id"]: body for body in map(_body, rows)}
    telemetry.annotate(
        lambda: {
            **citation_attributes(sources(found.values())),
            "adk.grounding.outcome": "resolved",
            "adk.grounding.requested_count": len(citation_ids),
            "adk.grounding.excerpt_count": sum(
                not found[cid]["erased"] for cid in citation_ids if cid in found
            ),
            "adk.grounding.tombstone_count": sum(
                found[cid]["erased"] for cid in citation_ids if cid in found
            ),
            "adk.grounding.not_found_count": sum(cid not in found for cid in citation_ids),
        }
    )
    return found


def _body(row: Record) -> Body:
    """The JSON of the `Excerpt` or `Tombstone` a resolved row is, field for field and in the
    schema's order, built without validating: every value comes from the row, and the
    characters are verified."""
    (
        citation_id,
        document_id,
        document_version,
        start,
        end,
        uri,
        page,
        section,
        expected,
        text,
        chunk_start,
        erased_at,
        request_ref,
        superseded_by,
    ) = row[-_RESOLVED_WIDTH:]
    body: Body = {
        "citation_id": citation_id,
        "document_id": document_id,
        "document_version": document_version,
        "span": {"start": start, "end": end},
        "text": None,
        "erased": erased_at is not None,
    }
    if erased_at is not None:
        body["erased_at"] = erased_at
        body["request_ref"] = request_ref
    else:
        if text is None or expected is None:
            # A live version's chunk always has its text and its hash: none is tampering.
            raise ExcerptIntegrityError(citation_id)
        body["text"] = exact_characters(
            citation_id=citation_id,
            start=start,
            end=end,
            expected_sha256=expected,
            text=text,
            offset=chunk_start,
        )
    body["superseded_by"] = superseded_by
    body["locator"] = {"uri": uri, "page": page, "section": section}
    return body


def _model(body: Body) -> Excerpt | Tombstone:
    return Tombstone.model_validate(body) if body["erased"] else Excerpt.model_validate(body)


class Source(NamedTuple):
    """A citation's document and version, as tracing names them."""

    document_id: str
    document_version: str


def sources(bodies: Iterable[Body]) -> Iterable[Source]:
    """What `citation_attributes` reads of each citation's body: its document id and version.
    Building whole citations for it would cost every request, traced or not."""
    return (Source(b["document_id"], b["document_version"]) for b in bodies)
