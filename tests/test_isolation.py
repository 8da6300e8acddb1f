"""Tenant isolation enforced by PostgreSQL itself: row-level security on every tenant table."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

import app.models  # noqa: F401  (registers every table)
from app.config import Settings
from app.db import APP_ROLE, Base, async_url, request_url, scope_to_tenant
from tests.factories import Keys, record_run, register_version

# Every table with a tenant column, found from the models, so a table added later is covered.
GLOBAL_TABLES = ("tenants", "api_keys")
# Checkpoints seal only committed transactions, never this test's own: the committed database
# of tests/test_audit_integrity.py has them, and row security on them is checked below.
SEALED_AFTER_COMMIT = ("audit_checkpoints",)
TENANT_TABLES = tuple(
    table.name
    for table in Base.metadata.sorted_tables
    if "tenant" in table.c and table.name not in GLOBAL_TABLES
)


async def _two_tenants_of_data(client: httpx.AsyncClient, keys: Keys) -> None:
    for tenant in ("acme", "globex"):
        await register_version(client, keys, tenant=tenant)
        run = await record_run(client, keys, tenant=tenant)
        citation_ids = [c["citation_id"] for c in run["citations"]]
        answer = await client.post(
            f"/v1/runs/{run['run_id']}/answers",
            json={
                "claims": [{"text": "Refunds take a month.", "citation_ids": citation_ids[:1]}],
                "citations": run["citations"],
            },
            headers=keys.headers("agent", tenant=tenant),
        )
        assert answer.status_code == 200, answer.text
        memory = await client.post(
            "/v1/memory",
            json={"text": "Refunds take a month.", "citation_ids": citation_ids[:1]},
            headers=keys.headers("agent", tenant=tenant),
        )
        assert memory.status_code == 201, memory.text
        erased = await client.post(
            "/v1/documents/refund-policy/erase",
            json={"reason": "test", "request_ref": f"DSR-{tenant}"},
            # The same key in both tenants: two keys, one in each, kept with the document named.
            headers=keys.headers("ingest", tenant=tenant) | {"Idempotency-Key": "erasure-1"},
        )
        assert erased.status_code == 200, erased.text
        await register_version(client, keys, tenant=tenant, version="2026-12-01")
        # An admin read is recorded in the admin's tenant; an integrity check seals a checkpoint.
        for scope, path in (("admin", "/v1/audit/runs"), ("audit", "/v1/audit/integrity")):
            read = await client.get(path, headers=keys.headers(scope, tenant=tenant))
            assert read.status_code == 200, read.text


async def test_unfiltered_select_sees_only_the_current_tenant(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await _two_tenants_of_data(client, keys)
    async with sessionmaker() as session:
        for tenant in ("acme", "globex"):
            await scope_to_tenant(session, tenant)
            for table in TENANT_TABLES:
                if table in SEALED_AFTER_COMMIT:
                    continue
                seen = (await session.execute(text(f"SELECT DISTINCT tenant FROM {table}"))).all()
                assert [row.tenant for row in seen] == [tenant], table


async def test_no_tenant_setting_sees_nothing(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await _two_tenants_of_data(client, keys)
    async with sessionmaker() as session:
        await session.execute(text("SELECT set_config('app.tenant', '', true)"))
        for table in TENANT_TABLES:
            count = (await session.execute(text(f"SELECT count(*) FROM {table}"))).scalar()
            assert count == 0, table


async def test_rows_of_another_tenant_cannot_be_written(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await _two_tenants_of_data(client, keys)
    async with sessionmaker() as session:
        await scope_to_tenant(session, "acme")
        updated = await session.execute(
            text("UPDATE citations SET span_sha256 = 'x' WHERE tenant = 'globex'")
        )
        assert updated.rowcount == 0  # type: ignore[attr-defined]
        with pytest.raises(DBAPIError, match="row-level security"):
            await session.execute(
                text(
                    "INSERT INTO runs (tenant, run_id, retrieved_at, key_id, citation_count)"
                    " VALUES ('globex', 'run_forged', now(), 'key_x', 0)"
                )
            )


async def test_request_role_owns_nothing_and_cannot_bypass_row_security(
    engine: AsyncEngine,
) -> None:
    async with engine.connect() as connection:
        role = (
            await connection.execute(
                text(
                    "SELECT current_user AS name, rolsuper, rolbypassrls FROM pg_roles"
                    " WHERE rolname = current_user"
                )
            )
        ).one()
        owned = (
            await connection.execute(
                text(
                    "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner"
                    " WHERE r.rolname = current_user"
                )
            )
        ).scalar()
        forced = (
            await connection.execute(
                text(
                    "SELECT relname FROM pg_class WHERE relname = ANY(:tables)"
                    " AND relrowsecurity AND relforcerowsecurity"
                ),
                {"tables": list(TENANT_TABLES)},
            )
        ).scalars()
    assert (role.name, role.rolsuper, role.rolbypassrls) == (APP_ROLE, False, False)
    assert owned == 0
    assert sorted(forced) == sorted(TENANT_TABLES)


async def test_tenant_setting_does_not_outlive_its_transaction_on_a_pooled_connection(
    settings: Settings,
) -> None:
    assert settings.database_url is not None
    single = create_async_engine(
        async_url(request_url(settings, settings.database_url)), pool_size=1, max_overflow=0
    )
    try:
        sessions = async_sessionmaker(single)
        async with sessions() as session, session.begin():
            await scope_to_tenant(session, "acme")
            pid = (await session.execute(text("SELECT pg_backend_pid()"))).scalar()
        async with sessions() as session, session.begin():
            again = (await session.execute(text("SELECT pg_backend_pid()"))).scalar()
            setting = (
                await session.execute(text("SELECT current_setting('app.tenant', true)"))
            ).scalar()
        assert again == pid, "the pool must have handed out the same connection"
        assert setting in (None, "")
    finally:
        await single.dispose()


async def test_auditor_role_reads_every_tenant_and_writes_nothing(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await _two_tenants_of_data(client, keys)
    async with sessionmaker() as session:
        await session.execute(text("SET LOCAL ROLE grounding_auditor"))
        tenants = (await session.execute(text("SELECT DISTINCT tenant FROM runs"))).scalars()
        assert sorted(tenants) == ["acme", "globex"]
        with pytest.raises(DBAPIError, match="permission denied"):
            await session.execute(text("DELETE FROM runs"))


async def test_admin_reads_another_tenant_only_when_it_names_it_and_the_read_is_recorded(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await register_version(client, keys)
    run = await record_run(client, keys)
    path = f"/v1/runs/{run['run_id']}"
    as_acme = {**keys.headers("admin", tenant="globex"), "X-Grounding-Tenant": "acme"}

    assert (
        await client.get(path, headers=keys.headers("admin", tenant="globex"))
    ).status_code == 404
    read = await client.get(path, headers=as_acme)
    assert read.status_code == 200, read.text
    assert read.json()["citations"] == run["citations"]
    excerpt = await client.get(
        f"/v1/citations/{run['citations'][0]['citation_id']}/excerpt", headers=as_acme
    )
    assert excerpt.status_code == 200

    async with sessionmaker() as session:
        await scope_to_tenant(session, "globex")
        recorded = (
            await session.execute(text("SELECT route, filters FROM admin_reads ORDER BY read_at"))
        ).all()
    assert [(r.route, r.filters) for r in recorded] == [
        (f"GET {path}", {"tenant": "acme"}),
        (f"GET /v1/citations/{run['citations'][0]['citation_id']}/excerpt", {"tenant": "acme"}),
    ]


async def test_naming_a_tenant_is_refused_to_non_admin_keys_and_on_writes(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    run = await record_run(client, keys)
    support = {**keys.headers("support", tenant="globex"), "X-Grounding-Tenant": "acme"}
    refused = await client.get(f"/v1/runs/{run['run_id']}", headers=support)
    agent = {**keys.headers("agent", tenant="globex"), "X-Grounding-Tenant": "acme"}
    write = await client.post("/v1/runs", json={"results": []}, headers=agent)
    assert (refused.status_code, write.status_code) == (403, 403)
    assert refused.json()["code"] == write.json()["code"] == "forbidden"
