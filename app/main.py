"""The application: routers, error handlers, health, metrics, and the engine's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.telemetry import TelemetryConfig
from opentelemetry.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.access.router import router as admin_router
from app.answers.router import router as answers_router
from app.audit.router import router as audit_router
from app.citations.router import router as citations_router
from app.collector import serving_collector
from app.config import Settings, get_settings
from app.db import (
    StatementPool,
    create_engine,
    create_sessionmaker,
    current_revision,
    head_revision,
    request_url,
)
from app.documents.router import router as documents_router
from app.errors import Problem, ServiceUnavailable, install_error_handlers, problem_response
from app.memory.router import router as memory_router
from app.metrics import Metrics
from app.middleware import RequestGuard
from app.runs.router import router as runs_router
from app.telemetry import instrument, otlp_tracer_provider

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: problem_response(description)
    for status, description in {
        401: "No API key, or one that does not open",
        403: "The key lacks the scope",
        404: "No such resource for this tenant",
        # Path parameters are matched decoded: one holding `/` can name another resource.
        405: "The path, as decoded, names a resource without this method",
        413: "Over a configured limit",
        422: "Invalid request, or a grounding rule broken",
        503: "The database cannot be reached; retry after Retry-After seconds",
    }.items()
}

# The service's telemetry is its own (`app.telemetry`: spans without text or query strings,
# Prometheus metrics, JSON log lines). FastAPI's native layer would add a second, unsanitized
# stream of each whenever the process has a global provider (or FASTAPI_OTEL_AUTO_CONFIGURE
# makes one from the OTLP endpoint the service is given), and looks those providers up on
# every request to find out.
_NO_NATIVE_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "auto_configure": False,
}


def _operation_id(route: APIRoute) -> str:
    return route.name


def _with_problem_schema(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The app's OpenAPI document with `Problem`, which every problem response refers to."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schemas = generate().setdefault("components", {}).setdefault("schemas", {})
            schemas["Problem"] = Problem.model_json_schema()
        return generate()  # built once, then cached on the app

    return openapi


def create_app(
    settings: Settings | None = None, *, tracer_provider: TracerProvider | None = None
) -> FastAPI:
    """Build the app; its lifespan owns the engine, unless a caller supplies the sessionmaker.

    Requests are traced with `tracer_provider` when one is given (the caller owns it), else over
    OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the lifespan flushes it), else not at all.
    """
    settings = settings or get_settings()
    head = head_revision()
    exporting = otlp_tracer_provider(settings) if tracer_provider is None else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.database_url is None:
            raise RuntimeError("DATABASE_URL is not set; start the service with `grounding serve`")
        engine = create_engine(settings, request_url(settings, settings.database_url))
        app.state.sessionmaker = create_sessionmaker(engine)
        if settings.statement_pool_size:
            app.state.statements = StatementPool.for_engine(
                engine, size=settings.statement_pool_size, timeout=settings.db_connect_timeout
            )
        try:
            with serving_collector():
                yield
        finally:
            if app.state.statements is not None:
                await app.state.statements.close()
            await engine.dispose()
            if exporting is not None:
                exporting.shutdown()

    app = FastAPI(
        title="grounding-service",
        version="0.1.0",
        summary="Auditable citations and fail-closed grounding checks for RAG answers",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        responses=PROBLEM_RESPONSES,
        telemetry=_NO_NATIVE_TELEMETRY,
    )
    app.openapi = _with_problem_schema(app)  # type: ignore[method-assign]
    app.state.metrics = Metrics()
    # Set by the lifespan; an app given its sessionmaker instead reads in sessions (`db.read`).
    app.state.statements = None
    app.state.settings = settings
    install_error_handlers(app, retry_after=settings.retry_after)
    # FastAPI tries each router in turn, at 6 to 12 us a router that does not match: the ones
    # agents call on every answer come first. No two routers' paths overlap, so the order
    # changes no route's meaning (`test_every_route_is_reached_by_its_own_path`).
    for router in (
        citations_router,
        answers_router,
        runs_router,
        documents_router,
        memory_router,
        audit_router,
        admin_router,
    ):
        app.include_router(router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz(request: Request) -> JSONResponse:
        async with request.app.state.sessionmaker() as session:
            revision = await current_revision(session)
        if revision != head:
            raise ServiceUnavailable("the database schema is not at the head revision")
        return JSONResponse({"status": "ready", "revision": revision})

    @app.get("/metrics", tags=["health"], include_in_schema=False)
    async def metrics(request: Request) -> Response:
        return Response(
            generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    provider = tracer_provider or exporting
    if provider is not None:
        instrument(app, provider)
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_body_bytes,
        max_depth=settings.max_json_depth,
        metrics=app.state.metrics,
    )
    return app
