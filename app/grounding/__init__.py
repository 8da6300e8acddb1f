"""The grounding core: citations, structured answers, fail-closed checks and excerpts. No I/O."""

from app.grounding.check import check_grounding, find_violations, rejection
from app.grounding.cite import RetrievalResult, cite
from app.grounding.errors import (
    ConfigurationError,
    DuplicateCitationIdError,
    GroundingError,
    QuoteMismatchError,
    TenantCrossingError,
    UncitedClaimError,
    UngroundedCitationError,
)
from app.grounding.excerpt import citation_attributes, excerpt
from app.grounding.models import (
    AnswerCitation,
    Citation,
    CitedAnswer,
    Claim,
    Excerpt,
    Locator,
    Quote,
    Span,
    Tombstone,
    Violation,
)

__all__ = [
    "AnswerCitation",
    "Citation",
    "CitedAnswer",
    "Claim",
    "ConfigurationError",
    "DuplicateCitationIdError",
    "Excerpt",
    "GroundingError",
    "Locator",
    "Quote",
    "QuoteMismatchError",
    "RetrievalResult",
    "Span",
    "TenantCrossingError",
    "Tombstone",
    "UncitedClaimError",
    "UngroundedCitationError",
    "Violation",
    "check_grounding",
    "citation_attributes",
    "cite",
    "excerpt",
    "find_violations",
    "rejection",
]
