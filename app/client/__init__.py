"""The grounding service's Python client, with the seed's surface over HTTP.

    async with GroundingClient(base_url, api_key) as client:
        retrieved = await client.cite(results, query=question, scope="HANDBOOK")
        answer = ...                                   # a CitedAnswer over `retrieved`
        await client.check_grounding(answer, retrieved)  # raises rather than returns a rejection
        await client.excerpt(retrieved[0])             # the exact characters cited, or a tombstone

Its exceptions are in `app.client.errors`; its retries in `app.client.retries`.
"""

from app.client.client import GroundingClient, RetrievedRun
from app.client.errors import (
    ConfigurationError,
    ConnectionFailed,
    DuplicateCitationIdError,
    Forbidden,
    IdempotencyMismatch,
    InternalError,
    NotFound,
    PayloadTooLarge,
    QuoteMismatchError,
    ServiceError,
    ServiceUnavailable,
    TenantCrossingError,
    Unauthorized,
    UncitedClaimError,
    UngroundedCitationError,
    ValidationFailed,
    VersionConflict,
)
from app.client.retries import RetryPolicy

__all__ = [
    "ConfigurationError",
    "ConnectionFailed",
    "DuplicateCitationIdError",
    "Forbidden",
    "GroundingClient",
    "IdempotencyMismatch",
    "InternalError",
    "NotFound",
    "PayloadTooLarge",
    "QuoteMismatchError",
    "RetrievedRun",
    "RetryPolicy",
    "ServiceError",
    "ServiceUnavailable",
    "TenantCrossingError",
    "Unauthorized",
    "UncitedClaimError",
    "UngroundedCitationError",
    "ValidationFailed",
    "VersionConflict",
]
