"""Test fixtures: a real PostgreSQL, migrated once; each test in one rolled-back transaction.

`TEST_DATABASE_URL` names a server to use; unset, the embedded PostgreSQL runs in a temporary
directory. Either way the suite works in a scratch database it creates and drops, and leaves no
server running behind it.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from app.config import Settings
from app.db import async_url, create_engine, migrate, request_url
from app.embedded import embedded_database
from app.main import create_app
from tests.factories import Keys, make_keys


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def admin_execute(url: str, statement: str) -> None:
    """Run one statement in the server's maintenance database (CREATE/DROP DATABASE)."""
    parsed = make_url(url)
    connection = await asyncpg.connect(_libpq(str(parsed.set(database="postgres"))))
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an `EXPLAIN (FORMAT JSON)` plan, the plan's own first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A PostgreSQL server: TEST_DATABASE_URL, or the embedded one for the session."""
    import os

    given = os.environ.get("TEST_DATABASE_URL")
    if given:
        yield given
        return
    with (
        tempfile.TemporaryDirectory(prefix="grounding-test-") as data_dir,
        embedded_database(Path(data_dir)) as url,
    ):
        yield url


@pytest.fixture(scope="session")
def scratch_database(server_url: str) -> Iterator[str]:
    """A fresh database on the server, migrated, dropped at the end of the session."""
    import asyncio

    name = f"grounding_test_{secrets.token_hex(4)}"
    asyncio.run(admin_execute(server_url, f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        migrate(url)
        yield url
    finally:
        asyncio.run(admin_execute(server_url, f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def settings(scratch_database: str) -> Settings:
    return Settings(database_url=scratch_database)


@pytest.fixture(scope="session")
async def engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    """Connections as the service's requests make them: the role row-level security binds."""
    assert settings.database_url is not None
    engine = create_engine(settings, request_url(settings, settings.database_url))
    yield engine
    await engine.dispose()


@pytest.fixture
async def connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One connection and an outer transaction that is rolled back after the test."""
    async with engine.connect() as connection:
        transaction = await connection.begin()
        try:
            yield connection
        finally:
            await transaction.rollback()


@asynccontextmanager
async def statements_sent(connection: AsyncConnection) -> AsyncIterator[list[str]]:
    """The SQL statements run on the test's connection while the block runs: through
    SQLAlchemy, and by the driver directly (`app.db.fetch`). The driver reports its own soon
    after each, so the two kinds are not in one order."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(args[2])

    def logged(query: Any) -> None:
        seen.append(query.query)

    driver = (await connection.get_raw_connection()).driver_connection
    assert driver is not None
    event.listen(connection.sync_connection, "before_cursor_execute", record)
    driver.add_query_logger(logged)
    try:
        yield seen
    finally:
        event.remove(connection.sync_connection, "before_cursor_execute", record)
        await asyncio.sleep(0)  # the driver calls its loggers soon after each statement
        driver.remove_query_logger(logged)


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    """Sessions joining the test's transaction as savepoints: commits are real, then discarded."""
    return async_sessionmaker(
        bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
    )


@pytest.fixture
def app(settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]) -> FastAPI:
    app = create_app(settings)
    app.state.sessionmaker = sessionmaker
    return app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://grounding.test") as client:
        yield client


@pytest.fixture
async def keys(sessionmaker: async_sessionmaker[AsyncSession]) -> Keys:
    """Tenant `acme` with a key of every scope, and tenant `globex` likewise."""
    return await make_keys(sessionmaker)


@dataclass
class Committed:
    """An app over a database of its own, committing as in production, and the owner's engine."""

    client: httpx.AsyncClient
    keys: Keys
    owner: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]


@asynccontextmanager
async def serving(
    app: FastAPI, base_url: str = "http://grounding.test"
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` over ASGI, with the app's lifespan (its engine and pools) running."""
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url=base_url) as client,
    ):
        yield client


@pytest.fixture
async def committed(server_url: str) -> AsyncIterator[Committed]:
    """A scratch database, migrated, served by an app whose lifespan made its engine and pools
    as in production, with no enclosing transaction, for the tests that need real commits
    (audit seals, vacuums, tampering as the owner) or production's own connections; dropped
    afterwards."""
    name = f"grounding_committed_{secrets.token_hex(4)}"
    await admin_execute(server_url, f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    owner = create_async_engine(async_url(url))
    try:
        await asyncio.to_thread(migrate, url)
        app = create_app(Settings(database_url=url))
        async with serving(app) as client:
            keys = await make_keys(app.state.sessionmaker)
            yield Committed(
                client=client, keys=keys, owner=owner, sessionmaker=app.state.sessionmaker
            )
    finally:
        await owner.dispose()
        await admin_execute(server_url, f'DROP DATABASE "{name}" WITH (FORCE)')
