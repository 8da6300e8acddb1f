"""Settings, read from the environment in this one place."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting the service reads, with its default. Names are the environment variables."""

    model_config = SettingsConfigDict(env_prefix="GROUNDING_", extra="ignore", frozen=True)

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL"),
        description="PostgreSQL server to use; unset starts the embedded PostgreSQL",
    )
    app_database_url: str | None = Field(
        default=None,
        description=(
            "The server as the service's requests reach it: a role that owns nothing and cannot"
            " bypass row-level security; unset, DATABASE_URL as the role grounding_app"
        ),
    )
    data_dir: Path = Field(
        default=Path(".grounding"), description="Where the embedded PostgreSQL keeps its data"
    )
    workers: int = Field(
        default=1, ge=1, description="Worker processes of `grounding serve`; --workers overrides it"
    )
    db_max_connections: int = Field(
        default=20,
        ge=1,
        description="Database connections one `grounding serve` holds at most, across its workers",
    )
    db_connect_timeout: float = Field(
        default=5.0, gt=0, description="Seconds to wait for a database connection"
    )
    shutdown_timeout: int = Field(
        default=10, gt=0, description="Seconds in-flight requests get to finish on SIGTERM"
    )
    retry_after: int = Field(
        default=2, ge=1, description="Retry-After seconds sent with 503 service_unavailable"
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Largest request body, in bytes, checked while it streams in",
    )
    max_text_chars: int = Field(
        default=8 * 1024 * 1024, ge=1, description="Longest version text, in code points"
    )
    max_chunks_per_version: int = Field(
        default=10_000, ge=1, description="Chunks per registered version"
    )
    max_results_per_run: int = Field(default=1_000, ge=1, description="Results per retrieval run")
    max_claims_per_answer: int = Field(default=1_000, ge=1, description="Claims per answer")
    max_citations_per_answer: int = Field(default=1_000, ge=1, description="Citations per answer")
    max_resolve_ids: int = Field(
        default=1_000, ge=1, description="Ids per `POST /v1/citations/resolve`"
    )
    idempotency_ttl: int = Field(
        default=24 * 60 * 60,
        ge=1,
        description=(
            "Seconds an `Idempotency-Key` keeps its first response; after that the key is new"
        ),
    )
    max_json_depth: int = Field(
        default=32, ge=4, description="Deepest nesting of arrays and objects in a request body"
    )
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("OTEL_EXPORTER_OTLP_ENDPOINT"),
        description="OTLP/HTTP collector that traces are sent to; unset, nothing is traced",
    )

    @property
    def pool_size(self) -> int:
        """Connections per worker: the connection budget shared by the workers, one at least."""
        return max(1, self.db_max_connections // self.workers)

    @property
    def statement_pool_size(self) -> int:
        """Of a worker's connections, those lent to reads that are their request's one statement
        (`db.StatementPool`): a quarter, as such a read holds its connection for one round trip
        where a session holds one for its whole request; none below four."""
        return self.pool_size // 4

    @property
    def session_pool_size(self) -> int:
        """Of a worker's connections, those of its sessions: the rest."""
        return self.pool_size - self.statement_pool_size


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()


async def app_settings(request: Request) -> Settings:
    """The settings the app was built with (`create_app(settings)`); a coroutine, since FastAPI
    would run a plain function in its thread pool on every request."""
    settings: Settings = request.app.state.settings
    return settings


# Read from the app, not through a dependency override: with any override in place, FastAPI
# rebuilds every route's dependency tree on every request.
SettingsDep = Annotated[Settings, Depends(app_settings)]
