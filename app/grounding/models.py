"""The seed's value types: what a citation pins, and the structured answer that rests on them.

Invariants kept here:
- offsets are Unicode code points into the version's text, `start` inclusive, `end` exclusive,
  `0 <= start < end`;
- a `CitedAnswer` never changes after it is built (checking reads it, never repairs it);
- a refusal carries no claims.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Literal, NamedTuple, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

IDENTIFIER_BYTES = 256


def _fits(value: str) -> str:
    # Ids key composite indexes: bounded in bytes, so no key outgrows an index entry. A code
    # point is four bytes at most, so a short id fits without being encoded.
    if (
        len(value) > IDENTIFIER_BYTES // 4
        and len(value.encode("utf-8", "surrogatepass")) > IDENTIFIER_BYTES
    ):
        raise ValueError(f"at most {IDENTIFIER_BYTES} bytes of UTF-8")
    return value


Identifier = Annotated[str, Field(min_length=1, max_length=IDENTIFIER_BYTES), AfterValidator(_fits)]
# Bounds on what an answer carries, none of them near what a real one needs: the body limit alone
# would let one claim or citation be megabytes long.
Prose = Annotated[str, Field(max_length=65_536)]
LocatorText = Annotated[str, Field(max_length=4096)]


def _unsigned_zero(value: float) -> float:
    # A run's scores reach the database as JSON numbers and its branches stay jsonb, and those
    # have no negative zero: a -0.0 kept as given would be read back as 0.0, and the run's audit
    # entry, hashed from what was given, would not verify.
    return value + 0.0


# JSON has no NaN or infinity, and what is hashed has none either (`app.audit.chain`).
Finite = Annotated[float, Field(allow_inf_nan=False)]
# A retriever's score; -0.0 is 0.0.
Score = Annotated[Finite, AfterValidator(_unsigned_zero)]
BranchName = Annotated[str, Field(max_length=256)]
# Retrieval branches by name (`bm25`, `vector`, `rerank`, ...) and their scores.
Branches = Annotated[dict[BranchName, Score], Field(max_length=64)]
# Ids one claim rests on. A claim's list of the wrong values is reported at its first bad item,
# so that claims times ids cannot multiply into millions of errors.
ClaimCitationIds = Annotated[tuple[Identifier, ...], Field(max_length=1000, fail_fast=True)]


def prose(texts: Iterable[str]) -> str:
    """Claims' texts as one answer reads them, in order."""
    return " ".join(texts)


class Frozen(BaseModel):
    """A value object: immutable, and strict about the fields it is given."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __eq__(self, other: object) -> bool:
        # Equal when of one type with equal fields: with no extras and no private state, that is
        # all BaseModel's general comparison finds, at a fifth of its cost (the check compares
        # four per carried citation).
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__


class Span(Frozen):
    """A half-open range `[start, end)` of offsets."""

    start: int = Field(ge=0)
    end: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.end <= self.start:
            raise ValueError("end must be greater than start")
        return self


class Locator(Frozen):
    """Where a reader goes to look."""

    uri: LocatorText | None = None
    page: int | None = None
    section: LocatorText | None = None


class Sourced(Protocol):
    """A citation's document and version, all that tracing names of it."""

    @property
    def document_id(self) -> str: ...

    @property
    def document_version(self) -> str: ...


# The fields an answer may repeat from its citation; each one it repeats must be as issued.
PINNED_FIELDS = (
    "document_id",
    "document_version",
    "run_id",
    "chunk_id",
    "span",
    "span_utf8",
    "span_utf16",
    "score",
    "branches",
    "retrieved_at",
    "locator",
)
# A citation's `PINNED_FIELDS` as plain values, in that order (`pinned_values`).
Pinned = tuple[object, ...]


class Issued(Sourced, Protocol):
    """What checking an answer reads of a citation its run issued: a `Citation`, or an
    `IssuedPin` made from its stored row."""

    @property
    def citation_id(self) -> str: ...

    @property
    def pinned(self) -> Pinned: ...

    @property
    def span_sha256(self) -> str | None: ...


class Citation(Frozen):
    """One retrieved chunk, pinned: document, version, chunk, span, tenant and scores."""

    citation_id: str
    run_id: str
    tenant: str
    document_id: str
    document_version: str
    chunk_id: str
    span: Span
    score: float | None
    branches: Branches
    retrieved_at: datetime
    locator: Locator
    span_sha256: str | None = Field(
        description="sha256 of the cited characters' UTF-8 bytes; null once the version is erased"
    )
    span_utf8: Span
    span_utf16: Span

    @property
    def pinned(self) -> Pinned:
        """The fields an answer may repeat, as `pinned_values` gives them."""
        return pinned_values(self)


class IssuedPin(NamedTuple):
    """An issued citation as checking an answer reads it (`Issued`), made from its stored values
    without building the `Citation`: they were validated when it was issued."""

    citation_id: str
    document_id: str
    document_version: str
    pinned: Pinned
    span_sha256: str | None


class AnswerCitation(Frozen):
    """A citation as an answer carries it: the issued fields, of which only the id is essential."""

    citation_id: Identifier
    document_id: Identifier
    document_version: Identifier
    tenant: Identifier | None = None
    run_id: Identifier | None = None
    chunk_id: Identifier | None = None
    span: Span | None = None
    # Not `Score`s: the answer is hashed as given, and a -0.0 repeated from it stays -0.0.
    score: Finite | None = None
    branches: Annotated[dict[BranchName, Finite], Field(max_length=64)] | None = None
    retrieved_at: datetime | None = None
    locator: Locator | None = None
    span_sha256: Identifier | None = None
    span_utf8: Span | None = None
    span_utf16: Span | None = None


def _bounds(span: Span | None) -> tuple[int, int] | None:
    return None if span is None else (span.start, span.end)


def pinned_values(citation: Citation | AnswerCitation) -> Pinned:
    """`citation`'s `PINNED_FIELDS` in order, as plain values that compare as the fields do: a
    span as `(start, end)`, the locator as `(uri, page, section)`, None where not given.

    An issued citation's are made from its row as well (`IssuedPin`): plain values cost no
    model to build, and compare without a Python call per model.
    """
    locator = citation.locator
    return (
        citation.document_id,
        citation.document_version,
        citation.run_id,
        citation.chunk_id,
        _bounds(citation.span),
        _bounds(citation.span_utf8),
        _bounds(citation.span_utf16),
        citation.score,
        citation.branches,
        citation.retrieved_at,
        None if locator is None else (locator.uri, locator.page, locator.section),
    )


class Quote(Frozen):
    """Words a claim quotes from one of its citations; they must occur in its pinned span."""

    citation_id: Identifier
    text: Annotated[str, Field(min_length=1, max_length=65_536)]


class Claim(Frozen):
    """One statement of the answer, the citation ids it rests on, and any words it quotes."""

    text: Prose
    citation_ids: ClaimCitationIds
    quotes: Annotated[tuple[Quote, ...], Field(max_length=1000, fail_fast=True)] = ()


class CitedAnswer(Frozen):
    """An answer as claims over citations; its prose is the claims' text in order."""

    claims: tuple[Claim, ...] = ()
    citations: tuple[AnswerCitation, ...] = ()
    refusal: bool = False

    @model_validator(mode="after")
    def _refusal_has_no_claims(self) -> CitedAnswer:
        if self.refusal and self.claims:
            raise ValueError("a refusal carries no claims")
        return self

    @property
    def text(self) -> str:
        """The claims as prose, in order."""
        return prose(claim.text for claim in self.claims)

    def sources(self, claim: Claim) -> list[AnswerCitation]:
        """The answer's citations that `claim` names, in the order it names them."""
        by_id = {citation.citation_id: citation for citation in self.citations}
        return [by_id[cid] for cid in claim.citation_ids if cid in by_id]

    def provenance(self) -> list[str]:
        """Every citation id some claim rests on, each once, in first-use order."""
        return list(dict.fromkeys(cid for claim in self.claims for cid in claim.citation_ids))


ViolationClass = Literal[
    "tenant_crossing",
    "duplicate_citation_id",
    "ungrounded_citation",
    "quote_mismatch",
    "uncited_claim",
]


class Violation(Frozen):
    """One broken rule: its class, where it was found, and what was missing and available."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    violation_class: ViolationClass = Field(alias="class")
    claim: int | None = None
    citation: int | None = None
    citation_id: str | None = None
    field: str | None = None
    missing: tuple[str, ...] | None = None
    available: tuple[str, ...] | None = None
    detail: str


class Excerpt(Frozen):
    """The exact cited characters of the pinned version."""

    citation_id: str
    document_id: str
    document_version: str
    span: Span
    text: str
    erased: Literal[False] = False
    superseded_by: str | None
    locator: Locator


class Tombstone(Frozen):
    """What remains of a citation whose version was erased: where it pointed, and why it is gone."""

    citation_id: str
    document_id: str
    document_version: str
    span: Span
    text: None = None
    erased: Literal[True] = True
    erased_at: datetime
    request_ref: str
    superseded_by: str | None
    locator: Locator
