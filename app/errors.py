"""Service errors and their one rendering: `application/problem+json` (RFC 9457) with a `code`.

    AppError                    carries its HTTP status, `code` and extension members
    ├── NotFound                404 not_found: missing, or another tenant's (never said which)
    ├── Unauthorized            401 unauthorized: no key, or one that does not open
    ├── Forbidden               403 forbidden: the key lacks the scope
    ├── VersionConflict         409 version_conflict
    ├── InvalidRequest          422 validation_error
    ├── IdempotencyMismatch     422 idempotency_mismatch: a used key, with another request
    ├── PayloadTooLarge         413 payload_too_large
    ├── IntegrityFailure        500 integrity_error: stored text no longer matches its hash
    └── ServiceUnavailable      503 service_unavailable, with Retry-After

The core's `GroundingError`s render here too (422, with `violations` or `errors`). Every body
has the shape of `Problem`, which the OpenAPI document gives for every problem response.
Document text never appears in a problem: details are written by the service, not copied from
input or from the database.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, TypeGuard

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.grounding.errors import ConfigurationError, GroundingError
from app.grounding.excerpt import ExcerptIntegrityError

logger = logging.getLogger("app.errors")

PROBLEM_JSON = "application/problem+json"
# A 422 lists this many of a request's validation errors, which could be as many as its body
# has values; `error_count` says how many there were.
MAX_LISTED_ERRORS = 100


class Problem(BaseModel):
    """A problem body (RFC 9457): the standard members, `code`, and the extensions of some codes."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="`urn:grounding:problem:` and the code")
    title: str
    status: int = Field(description="The HTTP status, repeated")
    detail: str = Field(description="What went wrong, in the service's words, never the input's")
    code: str = Field(description="What a client branches on, e.g. `configuration_error`")
    errors: list[dict[str, Any]] | None = Field(
        default=None,
        description=(
            "`validation_error`: each bad field (`loc`, `msg`, `type`); `configuration_error`:"
            " each bad result (`index`, `field`, `problem`)"
        ),
    )
    violations: list[dict[str, Any]] | None = Field(
        default=None,
        description="A rejected answer's every violation (`class`, `claim`, `citation`, ...)",
    )
    verification_id: str | None = Field(
        default=None, description="A rejected answer's record in the audit trail"
    )
    error_count: int | None = Field(
        default=None, description="`validation_error`: how many errors; `errors` lists the first"
    )
    limit: int | None = Field(default=None, description="`payload_too_large`: the limit")


class AppError(Exception):
    """A failure the service answers with a problem; `extensions` become members of the body."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extensions = extensions


class NotFound(AppError):
    """The resource does not exist for this tenant."""

    status, code, title = 404, "not_found", "Not found"


class Unauthorized(AppError):
    """No API key, or one that does not open."""

    status, code, title = 401, "unauthorized", "Unauthorized"


class Forbidden(AppError):
    """The key is valid but lacks the scope this operation needs."""

    status, code, title = 403, "forbidden", "Forbidden"


class VersionConflict(AppError):
    """A registered version's content would change, or an erased version would return."""

    status, code, title = 409, "version_conflict", "Version conflict"


class InvalidRequest(AppError):
    """The request is well-formed JSON but breaks a rule of its schema."""

    status, code, title = 422, "validation_error", "Validation error"


class IdempotencyMismatch(AppError):
    """The `Idempotency-Key` was first used with another method, path or body."""

    status, code, title = 422, "idempotency_mismatch", "Idempotency key mismatch"


class PayloadTooLarge(AppError):
    """The body, or a list or text in it, is over its configured limit."""

    status, code, title = 413, "payload_too_large", "Payload too large"


class IntegrityFailure(AppError):
    """Stored text no longer matches the hash pinned when it was cited."""

    status, code, title = 500, "integrity_error", "Integrity error"


class ServiceUnavailable(AppError):
    """The database cannot be reached; the client should retry after a pause."""

    status, code, title = 503, "service_unavailable", "Service unavailable"


class MethodNotAllowed(AppError):
    """The route exists, the method does not."""

    status, code, title = 405, "method_not_allowed", "Method not allowed"


def problem_response(description: str) -> dict[str, Any]:
    """An OpenAPI response whose body is a `Problem`, for a route's or the app's `responses`."""
    schema = {"$ref": "#/components/schemas/Problem"}
    return {"description": description, "content": {PROBLEM_JSON: {"schema": schema}}}


# What reads of cited text may answer: a live citation whose stored text is gone or no longer
# matches its hash is tampering, never the client's error.
INTEGRITY_RESPONSES: dict[int | str, dict[str, Any]] = {
    500: problem_response("`integrity_error`: the stored text does not match the citation")
}


def enforce_limit(what: str, count: int, limit: int) -> None:
    """Refuse `count` items of `what` over `limit` with a 413 that names the limit."""
    if count > limit:
        raise PayloadTooLarge(f"{what}: {count} is over the limit of {limit}", limit=limit)


def keeps_work(exc: BaseException) -> TypeGuard[GroundingError]:
    """A rejection that was recorded for audit commits its record before it is answered."""
    return isinstance(exc, GroundingError) and exc.verification_id is not None


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """The one place a problem body is built."""
    body = {"type": f"urn:grounding:problem:{code}", "title": title, "status": status}
    body |= {"detail": detail, "code": code} | extra
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def grounding_problem(error: GroundingError) -> JSONResponse:
    """A core rejection as a 422 problem, with every violation (or bad result) it found."""
    extra: dict[str, Any] = {}
    if isinstance(error, ConfigurationError):
        extra["errors"] = error.errors
    else:
        extra["violations"] = error.violations
    if error.verification_id is not None:
        extra["verification_id"] = error.verification_id
    title = error.code.replace("_", " ").capitalize()
    return problem(422, error.code, title, error.detail, **extra)


def _sqlstate(exc: Exception) -> str:
    sqlstate = getattr(exc.orig, "sqlstate", None) if isinstance(exc, DBAPIError) else None
    return sqlstate if isinstance(sqlstate, str) else ""


# The SQLSTATEs of a server going away or not there yet: a session ended by its shutdown
# (57P01 admin, 57P02 crash), a connection refused while it starts or stops (57P03) or over
# its limit (53300); and class 08, connection exceptions.
_SERVER_GONE = frozenset({"57P01", "57P02", "57P03", "53300"})


def database_unreachable(exc: Exception) -> bool:
    """Whether `exc` means the database could not be reached (as opposed to a query failing)."""
    if isinstance(exc, OSError | TimeoutError | PoolTimeoutError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError):
        sqlstate = _sqlstate(exc)
        return (
            exc.connection_invalidated
            or isinstance(exc, OperationalError)
            or sqlstate in _SERVER_GONE
            or sqlstate.startswith("08")
        )
    return False


# The SQLSTATEs of a character PostgreSQL cannot store (a NUL, or one with no encoding): only
# a request brings one, so the request is what is invalid.
_UNSTORABLE_CHARACTER = frozenset({"22021", "22P05"})


def unstorable_character(exc: Exception) -> bool:
    """Whether `exc` is the database refusing a character of some text in the request."""
    return _sqlstate(exc) in _UNSTORABLE_CHARACTER


def install_error_handlers(app: FastAPI, *, retry_after: int) -> None:
    """Map every error the app can raise to problem+json."""

    async def on_app_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AppError)
        headers = None
        if isinstance(exc, ServiceUnavailable):
            headers = {"Retry-After": str(retry_after)}
        elif isinstance(exc, Unauthorized):
            # A 401 names the scheme that would open the resource (RFC 9110, 15.5.2).
            headers = {"WWW-Authenticate": "Bearer"}
        return problem(exc.status, exc.code, exc.title, exc.detail, headers, **exc.extensions)

    async def on_grounding_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GroundingError)
        if keeps_work(exc):
            # A rejected answer, recorded for audit; passing ones are counted by their route.
            request.app.state.metrics.verifications.labels(outcome="rejected", code=exc.code).inc()
        return grounding_problem(exc)

    async def on_excerpt_integrity(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ExcerptIntegrityError)
        logger.error("excerpt integrity failure", extra={"citation_id": exc.citation_id})
        request.app.state.metrics.integrity_errors.inc()
        return await on_app_error(
            request, IntegrityFailure("the stored text does not match the citation's hash")
        )

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # Never echo `input` or `ctx`: they may hold document text.
        found = exc.errors()
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in found[:MAX_LISTED_ERRORS]
        ]
        return problem(
            422,
            "validation_error",
            "Validation error",
            "the request is not valid",
            errors=errors,
            error_count=len(found),
        )

    async def on_http_exception(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 405:
            error: AppError = MethodNotAllowed("this method is not allowed on this resource")
        elif exc.status_code == 404:
            error = NotFound("no such resource")
        elif exc.status_code == 400:
            # A body that is not even text (not UTF-8) is as invalid as one that is not JSON.
            error = InvalidRequest("the request body could not be parsed")
        else:
            return problem(exc.status_code, "http_error", "HTTP error", str(exc.detail))
        response = await on_app_error(request, error)
        # Starlette's own headers stay: a 405 says in `Allow` which methods the resource has.
        response.headers.update(exc.headers or {})
        return response

    async def on_database_error(request: Request, exc: Exception) -> JSONResponse:
        if database_unreachable(exc):
            logger.warning("database unreachable: %s", type(exc).__name__)
            return await on_app_error(request, ServiceUnavailable("the database cannot be reached"))
        if unstorable_character(exc):
            return await on_app_error(
                request,
                InvalidRequest("a text in the request holds a character that cannot be stored"),
            )
        return internal_error(exc)

    app.add_exception_handler(AppError, on_app_error)
    app.add_exception_handler(GroundingError, on_grounding_error)
    app.add_exception_handler(ExcerptIntegrityError, on_excerpt_integrity)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_exception)
    # The types a database failure surfaces as; anything else is caught by the outermost
    # middleware, which answers with `internal_error` (see `internal_error`).
    for database_error in (SQLAlchemyError, OSError, TimeoutError):
        app.add_exception_handler(database_error, on_database_error)


def internal_error(exc: BaseException) -> JSONResponse:
    """A 500 that logs only the exception's type: its message may quote stored text."""
    logger.error("unhandled %s", type(exc).__name__)
    return problem(500, "internal_error", "Internal error", "an internal error occurred")
