"""Migrations: up, down and up again on a scratch database, no drift, one migrator at a time."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

import app.models  # noqa: F401
from app.db import APP_ROLE, Base, alembic_config, async_url, head_revision, migrate
from tests.conftest import admin_execute


@pytest.fixture
async def blank_database(server_url: str) -> AsyncIterator[str]:
    name = f"grounding_scratch_{secrets.token_hex(4)}"
    await admin_execute(server_url, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        await admin_execute(server_url, f'DROP DATABASE "{name}" WITH (FORCE)')


@asynccontextmanager
async def _connected(url: str) -> AsyncIterator[AsyncConnection]:
    """A connection to `url` in a transaction that commits on leaving; its engine then closed."""
    engine = create_async_engine(async_url(url))
    try:
        async with engine.begin() as connection:
            yield connection
    finally:
        await engine.dispose()


def _drift(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


async def _inspect(url: str) -> tuple[list[Any], list[str]]:
    async with _connected(url) as connection:
        drift = await connection.run_sync(_drift)
        versions = await connection.execute(text("SELECT version_num FROM alembic_version"))
        return drift, list(versions.scalars())


async def test_upgrade_downgrade_upgrade_leaves_no_drift(blank_database: str) -> None:
    config = alembic_config(blank_database)
    await asyncio.to_thread(command.upgrade, config, "head")
    await asyncio.to_thread(command.downgrade, config, "base")
    await asyncio.to_thread(command.upgrade, config, "head")
    drift, versions = await _inspect(blank_database)
    assert drift == []
    assert versions == [head_revision()]


async def _text_compression(url: str) -> tuple[bool, set[str]]:
    """Whether the server offers lz4, and the methods the stored texts' columns are set to."""
    async with _connected(url) as connection:
        offered = await connection.scalar(
            text(
                "SELECT 'lz4' = ANY(enumvals) FROM pg_settings"
                " WHERE name = 'default_toast_compression'"
            )
        )
        methods = await connection.scalars(
            text(
                "SELECT attcompression::text FROM pg_attribute WHERE attname = 'text'"
                " AND attrelid = ANY('{document_versions,chunks,memory_records}'::regclass[])"
            )
        )
        return bool(offered), set(methods)


async def test_stored_texts_are_compressed_with_lz4_where_the_server_has_it(
    blank_database: str,
) -> None:
    config = alembic_config(blank_database)
    await asyncio.to_thread(command.upgrade, config, "head")
    offered, methods = await _text_compression(blank_database)
    # "" is the server's default method (pglz unless configured otherwise).
    assert methods == ({"l"} if offered else {""})
    await asyncio.to_thread(command.downgrade, config, "0005")
    assert await _text_compression(blank_database) == (offered, {""})


async def _blast_radius_indexes(url: str) -> dict[str, list[tuple[str, bool, list[str]]]]:
    """Each blast radius table's indexes: name, whether it is the primary key, its columns."""
    async with _connected(url) as connection:
        rows = await connection.execute(
            text(
                "SELECT i.indrelid::regclass::text, i.indexrelid::regclass::text,"
                " i.indisprimary, array_agg(a.attname::text ORDER BY k.n)"
                " FROM pg_index i"
                " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                " WHERE i.indrelid::regclass::text"
                " IN ('verification_citations', 'memory_citations')"
                " GROUP BY 1, 2, 3 ORDER BY 1, 2"
            )
        )
        found: dict[str, list[tuple[str, bool, list[str]]]] = {}
        for table, index, primary, columns in rows:
            found.setdefault(table, []).append((index, primary, list(columns)))
        return found


async def test_blast_radius_tables_keep_one_index_led_by_the_citation(
    blank_database: str,
) -> None:
    config = alembic_config(blank_database)
    await asyncio.to_thread(command.upgrade, config, "head")
    assert await _blast_radius_indexes(blank_database) == {
        "memory_citations": [("pk_memory_citations", True, ["tenant", "citation_id", "memory_id"])],
        "verification_citations": [
            ("pk_verification_citations", True, ["tenant", "citation_id", "verification_id"])
        ],
    }
    await asyncio.to_thread(command.downgrade, config, "0006")
    assert await _blast_radius_indexes(blank_database) == {
        "memory_citations": [
            ("ix_memory_citations_tenant_citation_id", False, ["tenant", "citation_id"]),
            ("pk_memory_citations", True, ["tenant", "memory_id", "citation_id"]),
        ],
        "verification_citations": [
            ("ix_verification_citations_tenant_citation_id", False, ["tenant", "citation_id"]),
            ("pk_verification_citations", True, ["tenant", "verification_id", "citation_id"]),
        ],
    }


def _collation(column: Any) -> str | None:
    type_ = getattr(column.type, "item_type", column.type)
    return getattr(type_, "collation", None)


# Autogenerate's comparison passes a collation only one side names, so drift checks miss it.
MODEL_C_COLUMNS = {
    (table.name, column.name)
    for table in Base.metadata.sorted_tables
    for column in table.columns
    if _collation(column) == "C"
}


async def _c_columns(url: str) -> set[tuple[str, str]]:
    """The columns of the schema's tables, arrays included, whose collation is "C"."""
    async with _connected(url) as connection:
        rows = await connection.execute(
            text(
                "SELECT c.relname::text, a.attname::text FROM pg_attribute a"
                " JOIN pg_class c ON c.oid = a.attrelid"
                " JOIN pg_collation k ON k.oid = a.attcollation"
                " WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'"
                " AND a.attnum > 0 AND NOT a.attisdropped AND k.collname = 'C'"
            )
        )
        return {(table, column) for table, column in rows}


async def test_ids_names_and_codes_are_compared_byte_by_byte(blank_database: str) -> None:
    assert {("citations", "citation_id"), ("verifications", "provenance")} <= MODEL_C_COLUMNS
    assert ("chunks", "text") not in MODEL_C_COLUMNS
    config = alembic_config(blank_database)
    await asyncio.to_thread(command.upgrade, config, "head")
    assert await _c_columns(blank_database) == MODEL_C_COLUMNS
    await asyncio.to_thread(command.downgrade, config, "0007")
    assert await _c_columns(blank_database) == set()


def test_concurrent_migrations_apply_once(blank_database: str) -> None:
    environment = {**os.environ, "DATABASE_URL": blank_database}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "app", "migrate"],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    _, versions = asyncio.run(_inspect(blank_database))
    assert versions == [head_revision()]


async def test_migrate_is_a_no_op_at_head(blank_database: str) -> None:
    await asyncio.to_thread(migrate, blank_database)
    await asyncio.to_thread(migrate, blank_database)
    drift, versions = await _inspect(blank_database)
    assert (drift, versions) == ([], [head_revision()])


async def _app_role_has_password(url: str) -> bool:
    async with _connected(url) as connection:
        found = await connection.scalar(
            text("SELECT rolpassword IS NOT NULL FROM pg_authid WHERE rolname = :role"),
            {"role": APP_ROLE},
        )
        return bool(found)


def test_migrate_gives_the_request_role_the_password_of_its_url(blank_database: str) -> None:
    try:
        migrate(blank_database, app_password="it's a s3cret")
        assert asyncio.run(_app_role_has_password(blank_database))
    finally:
        asyncio.run(_clear_app_password(blank_database))
    assert not asyncio.run(_app_role_has_password(blank_database))


async def _clear_app_password(url: str) -> None:
    async with _connected(url) as connection:
        await connection.execute(text(f"ALTER ROLE {APP_ROLE} PASSWORD NULL"))
