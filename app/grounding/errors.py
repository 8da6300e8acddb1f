"""The grounding rules' exceptions.

    GroundingError                  a rule of the seed was broken; carries `violations`
    ├── ConfigurationError          a retrieved chunk cannot be pinned (carries `errors`)
    ├── TenantCrossingError         an answer citation names another tenant
    ├── DuplicateCitationIdError    two answer citations share an id
    ├── UngroundedCitationError     an id the answer or run lacks (`missing`, `available`)
    ├── QuoteMismatchError          a quote does not occur in its citation's pinned span
    └── UncitedClaimError           a claim rests on no citation

Each class has the problem `code` the service answers with, so the client can map a code back
to the same class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar


class GroundingError(Exception):
    """A grounding rule was broken; nothing was repaired."""

    code: ClassVar[str] = "grounding_error"

    def __init__(
        self,
        detail: str,
        *,
        violations: Sequence[dict[str, Any]] = (),
        verification_id: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.violations = [dict(v) for v in violations]
        self.verification_id = verification_id

    @property
    def missing(self) -> list[str]:
        """Every id some violation found missing, each once, in order."""
        return _collect(self.violations, "missing")

    @property
    def available(self) -> list[str]:
        """Every id some violation offered as available, each once, in order."""
        return _collect(self.violations, "available")


class ConfigurationError(GroundingError):
    """A retrieved chunk lacks its version or span, or disagrees with the registry."""

    code = "configuration_error"

    def __init__(self, detail: str, *, errors: Sequence[dict[str, Any]]) -> None:
        super().__init__(detail)
        self.errors = [dict(e) for e in errors]


class TenantCrossingError(GroundingError):
    """An answer citation belongs to another tenant."""

    code = "tenant_crossing"


class DuplicateCitationIdError(GroundingError):
    """Two citations in one answer share an id, so a claim naming it is ambiguous."""

    code = "duplicate_citation_id"


class UngroundedCitationError(GroundingError):
    """A claim names an id the answer lacks, or a citation names what the run did not issue."""

    code = "ungrounded_citation"


class QuoteMismatchError(GroundingError):
    """A claim quotes words that do not occur in the cited span."""

    code = "quote_mismatch"


class UncitedClaimError(GroundingError):
    """A claim rests on no citation, or the run retrieved nothing to rest on."""

    code = "uncited_claim"


# The order in which a rejected answer's `code` is chosen: the first class found wins.
VIOLATION_ORDER: tuple[type[GroundingError], ...] = (
    TenantCrossingError,
    DuplicateCitationIdError,
    UngroundedCitationError,
    QuoteMismatchError,
    UncitedClaimError,
)

_ALL_CLASSES: tuple[type[GroundingError], ...] = (ConfigurationError, *VIOLATION_ORDER)
ERRORS_BY_CODE: dict[str, type[GroundingError]] = {cls.code: cls for cls in _ALL_CLASSES}


def _collect(violations: Sequence[dict[str, Any]], key: str) -> list[str]:
    seen: dict[str, None] = {}
    for violation in violations:
        for item in violation.get(key) or ():
            seen.setdefault(item, None)
    return list(seen)
