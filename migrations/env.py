"""Alembic environment: async engine, one transaction, and an advisory lock so that concurrent
`migrate` calls (two `serve` processes starting at once) apply each migration exactly once."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

import app.models  # noqa: F401  (registers every table on the metadata)
from app.db import Base, async_url

MIGRATION_LOCK = 0x67726E64  # "grnd"

config = context.config


def run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        context.run_migrations()


async def run_online() -> None:
    engine = create_async_engine(async_url(config.attributes["url"]), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(run_migrations)
    finally:
        await engine.dispose()


given: Connection | None = config.attributes.get("connection")
if given is not None:
    run_migrations(given)
else:
    asyncio.run(run_online())
