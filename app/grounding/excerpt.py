"""A citation resolved to the exact characters it pins, and span attributes that carry no text.

Invariants kept here:
- an excerpt is the pinned version's characters at the pinned span, verified against the
  citation's `span_sha256`; a mismatch raises, it never returns wrong text;
- telemetry attributes carry counts, document ids and versions, never text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.grounding.cite import span_sha256
from app.grounding.models import Citation, Excerpt, Sourced


class ExcerptIntegrityError(Exception):
    """The stored characters no longer hash to what the citation pinned."""

    def __init__(self, citation_id: str) -> None:
        super().__init__(f"citation {citation_id}: stored text does not match its span_sha256")
        self.citation_id = citation_id


def exact_characters(
    *, citation_id: str, start: int, end: int, expected_sha256: str, text: str, offset: int = 0
) -> str:
    """The characters `[start, end)` of a version from `text`, which starts at its code point
    `offset`. Plain offsets, not a `Span`: resolving a batch calls this once a row."""
    cited = text[start - offset : end - offset]
    if len(cited) != end - start or span_sha256(cited) != expected_sha256:
        raise ExcerptIntegrityError(citation_id)
    return cited


def excerpt(
    citation: Citation, text: str, *, offset: int = 0, superseded_by: str | None = None
) -> Excerpt:
    """The exact characters `citation` pins, from its version's `text` (or a part at `offset`)."""
    if citation.span_sha256 is None:
        raise ExcerptIntegrityError(citation.citation_id)
    return Excerpt(
        citation_id=citation.citation_id,
        document_id=citation.document_id,
        document_version=citation.document_version,
        span=citation.span,
        text=exact_characters(
            citation_id=citation.citation_id,
            start=citation.span.start,
            end=citation.span.end,
            expected_sha256=citation.span_sha256,
            text=text,
            offset=offset,
        ),
        superseded_by=superseded_by,
        locator=citation.locator,
    )


def citation_attributes(citations: Iterable[Sourced]) -> dict[str, int | Sequence[str]]:
    """Span attributes for tracing: counts, document ids and versions under `adk.citation.*`."""
    items = list(citations)
    documents = sorted({c.document_id for c in items})
    versions = sorted({f"{c.document_id}@{c.document_version}" for c in items})
    return {
        "adk.citation.count": len(items),
        "adk.citation.document_count": len(documents),
        "adk.citation.document_ids": documents,
        "adk.citation.document_versions": versions,
    }
