"""Tracing: OpenTelemetry spans of requests and of the grounding operations, never of text.

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set (then spans go over OTLP/HTTP) or the caller of
`create_app` passes a tracer provider of its own. When on, the FastAPI instrumentation opens a
server span per request and the services open one grounding span per operation (`cite`,
`check`, `excerpt`, `resolve`, `erase`) inside it; when off, nothing is instrumented and the
grounding spans are no-ops.

Invariants kept here:
- a grounding span carries ids, versions, counts, an outcome and a code, under `adk.citation.*`
  and `adk.grounding.*`: never document text, claim text or a query;
- the server span's URL has no query string, and no body or header is recorded;
- an exception is recorded by its type and code, never its message or traceback: a database
  error's message can quote what was stored;
- SQL statements are not traced (their parameters hold the corpus).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue
from starlette.types import ASGIApp, Receive, Scope, Send

from app.config import Settings
from app.errors import AppError
from app.grounding.errors import ConfigurationError, GroundingError
from app.grounding.excerpt import ExcerptIntegrityError

SERVICE = "grounding-service"

P = ParamSpec("P")
T = TypeVar("T")

# The tracer of the app serving the current request; None outside a traced request.
_current_tracer: ContextVar[Tracer | None] = ContextVar("grounding_tracer", default=None)
_NO_TRACER = trace.NoOpTracer()
# The innermost grounding span, which `annotate` adds to (never some other library's span).
_current_span: ContextVar[Span] = ContextVar("grounding_span", default=trace.INVALID_SPAN)

# URL attributes of the server span, under the old and the stable HTTP conventions.
_URL_ATTRIBUTES = ("http.url", "url.full")
_QUERY_ATTRIBUTES = ("url.query",)


def otlp_tracer_provider(settings: Settings) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`, or None when unset.

    The exporter reads the rest of its configuration (`OTEL_EXPORTER_OTLP_HEADERS`, timeout,
    compression, certificates) and the resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`)
    from the environment as the OpenTelemetry SDK documents.
    """
    if not settings.otel_exporter_otlp_endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    provider = TracerProvider(resource=resource)
    endpoint = settings.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def instrument(app: FastAPI, provider: trace.TracerProvider) -> None:
    """Trace `app`'s requests with `provider`, and its grounding operations too."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=provider,
        # Request metrics are Prometheus's (app.metrics); OpenTelemetry's would duplicate them.
        meter_provider=NoOpMeterProvider(),
        server_request_hook=_without_query,
        # The per-message spans say nothing the server span does not.
        exclude_spans=["receive", "send"],
        # Headers are not captured unless an operator asks; even then, never the key.
        http_capture_headers_sanitize_fields=["authorization", "cookie"],
    )
    app.add_middleware(_CurrentTracer, tracer=provider.get_tracer(__name__))


def _without_query(span: Span, scope: Mapping[str, Any]) -> None:
    """Drop the query string from the server span: only the path, which holds only ids, stays."""
    recorded: Mapping[str, Any] = getattr(span, "attributes", None) or {}
    for name in _URL_ATTRIBUTES:
        url = recorded.get(name)
        if isinstance(url, str):
            span.set_attribute(name, url.partition("?")[0])
    for name in _QUERY_ATTRIBUTES:
        if name in recorded:
            span.set_attribute(name, "")


class _CurrentTracer:
    """Makes the app's tracer the one the services' grounding spans use during a request."""

    def __init__(self, app: ASGIApp, *, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _current_tracer.set(self.tracer)
        try:
            await self.app(scope, receive, send)
        finally:
            _current_tracer.reset(token)


def traced(
    name: str,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """Run the decorated service function in a grounding span named `name`."""

    def decorate(function: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(function)
        async def in_span(*args: P.args, **kwargs: P.kwargs) -> T:
            if _current_tracer.get() is None:
                # Not traced: a no-op span would still cost its context manager and context
                # variables on every call, and `annotate` finds no span to record on.
                return await function(*args, **kwargs)
            with grounding_span(name):
                return await function(*args, **kwargs)

        return in_span

    return decorate


Attributes = Mapping[str, AttributeValue]


def annotate(attributes: Attributes | Callable[[], Attributes]) -> None:
    """Add `attributes` (ids, versions, counts, outcomes: never text) to the grounding span.

    Given a function, it is called only when the span is recorded, so what costs work to count
    costs nothing when tracing is off.
    """
    span = _current_span.get()
    if span.is_recording():
        span.set_attributes(attributes() if callable(attributes) else attributes)


@contextmanager
def grounding_span(name: str) -> Iterator[Span]:
    """A span of one grounding operation; an exception leaves only its code on it.

    A rejection (a grounding rule broken) is an outcome, not an error: `adk.grounding.outcome`
    is `rejected` with its `code` and `violation_count`. A service error (not found, ...) is
    `failed` with its code; anything else is `failed` with its `error.type` and an error status.
    """
    tracer = _current_tracer.get() or _NO_TRACER
    with tracer.start_as_current_span(
        name, record_exception=False, set_status_on_exception=False
    ) as span:
        token = _current_span.set(span)
        try:
            yield span
        except GroundingError as exc:
            found = exc.errors if isinstance(exc, ConfigurationError) else exc.violations
            span.set_attributes(
                {
                    "adk.grounding.outcome": "rejected",
                    "adk.grounding.code": exc.code,
                    "adk.grounding.violation_count": len(found),
                }
            )
            raise
        except AppError as exc:
            span.set_attributes({"adk.grounding.outcome": "failed", "adk.grounding.code": exc.code})
            raise
        except Exception as exc:
            failed: dict[str, AttributeValue] = {
                "adk.grounding.outcome": "failed",
                "error.type": type(exc).__name__,
            }
            if isinstance(exc, ExcerptIntegrityError):
                failed["adk.grounding.code"] = "integrity_error"
            span.set_attributes(failed)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            _current_span.reset(token)
