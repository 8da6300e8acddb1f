"""The client's exceptions: one class per problem `code` the service answers with.

    ServiceError                    the service answered with a problem, or could not be reached
    ├── ConfigurationError          422 configuration_error    ┐ each is also the core's class
    ├── TenantCrossingError         422 tenant_crossing        │ of the same name, so
    ├── DuplicateCitationIdError    422 duplicate_citation_id  │ `except GroundingError` (or
    ├── UngroundedCitationError     422 ungrounded_citation    │ `except UncitedClaimError`)
    ├── QuoteMismatchError          422 quote_mismatch         │ catches them over HTTP as it
    ├── UncitedClaimError           422 uncited_claim          ┘ does in process
    ├── ValidationFailed            422 validation_error: the request broke its schema (`errors`)
    ├── IdempotencyMismatch         422 idempotency_mismatch: the key was used by another request
    ├── Unauthorized                401 unauthorized: no key, or one that does not open
    ├── Forbidden                   403 forbidden: the key lacks the scope
    ├── NotFound                    404 not_found: missing, or another tenant's
    ├── VersionConflict             409 version_conflict
    ├── PayloadTooLarge             413 payload_too_large
    ├── ServiceUnavailable          503 service_unavailable: the database was unreachable and
    │                               nothing was written; retried within the client's budget
    ├── InternalError               500 internal_error or integrity_error
    └── ConnectionFailed            no answer at all; a write may or may not have happened

Every instance carries `status`, `detail`, the problem body as `problem`, the `request_id` the
service gave it, and `verification_id`, `violations` and `errors` where the body had them; the
grounding classes keep the core's `missing` and `available`. A code the client does not know is
raised as the class of its status, or as `ServiceError` itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from app.grounding import errors as core


class ServiceError(Exception):
    """The service answered with a problem (RFC 9457), or did not answer."""

    code: ClassVar[str] = "service_error"
    default_status: ClassVar[int | None] = None

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        problem: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> None:
        # Every attribute a core grounding error would set is set here, from the problem, so
        # the grounding classes below need not call the core's initialisers.
        Exception.__init__(self, detail)
        body = dict(problem or {})
        self.detail = detail
        self.status = status if status is not None else self.default_status
        self.problem = body
        self.request_id = request_id
        self.verification_id: str | None = body.get("verification_id")
        self.violations: list[dict[str, Any]] = [dict(v) for v in body.get("violations") or ()]
        self.errors: list[dict[str, Any]] = [dict(e) for e in body.get("errors") or ()]


class ConfigurationError(ServiceError, core.ConfigurationError):
    """A retrieved chunk cannot be pinned; `errors` lists each bad result and field."""

    code, default_status = core.ConfigurationError.code, 422


class TenantCrossingError(ServiceError, core.TenantCrossingError):
    """An answer citation belongs to another tenant."""

    code, default_status = core.TenantCrossingError.code, 422


class DuplicateCitationIdError(ServiceError, core.DuplicateCitationIdError):
    """Two citations in the answer share an id."""

    code, default_status = core.DuplicateCitationIdError.code, 422


class UngroundedCitationError(ServiceError, core.UngroundedCitationError):
    """An id the answer or the run lacks; `missing` and `available` say which."""

    code, default_status = core.UngroundedCitationError.code, 422


class QuoteMismatchError(ServiceError, core.QuoteMismatchError):
    """A claim quotes words that do not occur in the cited span."""

    code, default_status = core.QuoteMismatchError.code, 422


class UncitedClaimError(ServiceError, core.UncitedClaimError):
    """A claim rests on no citation, or the run retrieved nothing to rest on."""

    code, default_status = core.UncitedClaimError.code, 422


class ValidationFailed(ServiceError):
    """The request broke its schema; `errors` locates each problem."""

    code, default_status = "validation_error", 422


class IdempotencyMismatch(ServiceError):
    """The request's `Idempotency-Key` was first used with another request."""

    code, default_status = "idempotency_mismatch", 422


class Unauthorized(ServiceError):
    """No API key, or one that does not open."""

    code, default_status = "unauthorized", 401


class Forbidden(ServiceError):
    """The key lacks the scope this operation needs."""

    code, default_status = "forbidden", 403


class NotFound(ServiceError):
    """No such resource for this tenant (another tenant's looks the same)."""

    code, default_status = "not_found", 404


class VersionConflict(ServiceError):
    """A registered version's content would change."""

    code, default_status = "version_conflict", 409


class PayloadTooLarge(ServiceError):
    """The body, or a list or text in it, is over the service's limit."""

    code, default_status = "payload_too_large", 413


class ServiceUnavailable(ServiceError):
    """The database could not be reached, so nothing was written; try again later."""

    code, default_status = "service_unavailable", 503


class InternalError(ServiceError):
    """The service failed; it says nothing of why."""

    code, default_status = "internal_error", 500


class ConnectionFailed(ServiceError):
    """The service could not be reached or did not answer; a write may or may not have happened."""

    code = "connection_failed"


GROUNDING_ERRORS: tuple[type[ServiceError], ...] = (
    ConfigurationError,
    TenantCrossingError,
    DuplicateCitationIdError,
    UngroundedCitationError,
    QuoteMismatchError,
    UncitedClaimError,
)

_SERVICE_ERRORS: tuple[type[ServiceError], ...] = (
    ValidationFailed,
    IdempotencyMismatch,
    Unauthorized,
    Forbidden,
    NotFound,
    VersionConflict,
    PayloadTooLarge,
    ServiceUnavailable,
    InternalError,
)

ERRORS_BY_CODE: dict[str, type[ServiceError]] = {
    cls.code: cls for cls in (*GROUNDING_ERRORS, *_SERVICE_ERRORS)
} | {"integrity_error": InternalError}

_ERRORS_BY_STATUS: dict[int, type[ServiceError]] = {
    cls.default_status: cls
    for cls in ERRORS_BY_CODE.values()
    if cls.default_status is not None and cls.default_status != 422
}


def error_for(
    status: int, problem: Mapping[str, Any], *, request_id: str | None = None
) -> ServiceError:
    """The exception a problem answer stands for: by its `code`, else by its status."""
    code = problem.get("code")
    error_class = ERRORS_BY_CODE.get(code) if isinstance(code, str) else None
    if error_class is None:
        error_class = _ERRORS_BY_STATUS.get(status)
        if error_class is None and status >= 500:
            error_class = InternalError
    detail = problem.get("detail")
    if not isinstance(detail, str) or not detail:
        detail = f"the service answered {status}"
    return (error_class or ServiceError)(
        detail, status=status, problem=problem, request_id=request_id
    )
