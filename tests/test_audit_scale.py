"""The audit queries stay on indexes at volume.

A scratch database (committed, dropped afterwards) is filled as its owner with hundreds of
thousands of runs, citations and verifications over several tenants, and analyzed. Every
statement the audit routes run is captured as it goes to the server, then explained with the
same parameters as the request role, with the tenant set (and as the auditor for admin reads):
none may scan a big table from end to end, nor walk an index only to filter most of it away.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.audit.queries import AUDITOR_ROLE
from app.config import Settings
from app.db import async_url, create_engine, create_sessionmaker, migrate, request_url
from app.main import create_app
from tests.conftest import admin_execute, plan_nodes
from tests.factories import Keys, make_keys

ROWS = 300_000
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
DOCUMENTS = 2000
# Rows a scan may read only to discard them: a few pages' worth, never a table's worth.
DISCARDED = 500
BIG_TABLES = frozenset(
    {
        "runs",
        "citations",
        "verifications",
        "verification_citations",
        "memory_records",
        "memory_citations",
        "erasures",
        "document_versions",
    }
)

# One run per row number, spread over ~60 days, each with one citation and one verification
# (7 in 10 grounded, 1 in 100 a rare code); a memory record for every fifth, an erasure for
# every twentieth; forty keys. Each
# stage commits before the next; the statements of a stage run side by side.
_RUNS = [
    f"""
    INSERT INTO tenants (name) SELECT unnest(ARRAY{list(TENANTS)}) ON CONFLICT DO NOTHING
    """,
    f"""
    CREATE UNLOGGED TABLE volume AS
    SELECT g, lpad(g::text, 7, '0') AS id,
           (ARRAY{list(TENANTS)})[1 + g % {len(TENANTS)}] AS tenant,
           now() - make_interval(secs => ({ROWS} - g) * 17) AS at
      FROM generate_series(1, {ROWS}) AS g
     ORDER BY 3, 1
    """,
    f"""
    INSERT INTO document_versions (tenant, document_id, version, chunk_count, created_at)
    SELECT t, 'doc_' || d, 'v1', 1, now() - interval '90 days'
      FROM unnest(ARRAY{list(TENANTS)}) AS t, generate_series(0, {DOCUMENTS - 1}) AS d
    """,
    """
    INSERT INTO runs (tenant, run_id, query, scope, retrieved_at, key_id, citation_count)
    SELECT tenant, 'run_' || id, 'how long?', 'HANDBOOK', at, 'key_' || (g % 40), 1 FROM volume
    """,
]
_CITATIONS = [
    f"""
    INSERT INTO citations (tenant, citation_id, run_id, ordinal, document_id, document_version,
                           chunk_id, span_start, span_end, utf8_start, utf8_end, utf16_start,
                           utf16_end, score, branches, retrieved_at, span_hmac)
    SELECT tenant, 'cit_' || id, 'run_' || id, 0, 'doc_' || (g % {DOCUMENTS}), 'v1', 'c1',
           0, 10, 0, 10, 0, 10, 0.5, '{{}}', at, repeat('0', 64)
      FROM volume
    """,
]
_VERIFICATIONS = [
    """
    INSERT INTO verifications (tenant, verification_id, run_id, key_id, outcome, code,
                               violations, claims, provenance, claim_count, citation_count,
                               answer_sha256, created_at)
    SELECT tenant, 'ver_' || id, 'run_' || id, 'key_' || (g % 40),
           CASE WHEN g % 10 < 7 THEN 'grounded' WHEN g % 10 = 7 THEN 'refused'
                ELSE 'rejected' END,
           CASE WHEN g % 100 = 9 THEN 'tenant_crossing' WHEN g % 10 = 8 THEN 'uncited_claim'
                WHEN g % 10 = 9 THEN 'ungrounded_citation' END,
           '[]', '[]', ARRAY['cit_' || id], 1, 1, repeat('0', 64), at + interval '1 second'
      FROM volume
    """,
]
_THE_REST = [
    """
    INSERT INTO verification_citations (tenant, verification_id, citation_id)
    SELECT tenant, 'ver_' || id, 'cit_' || id FROM volume
    """,
    """
    INSERT INTO memory_records (tenant, memory_id, text, citation_ids, key_id, created_at)
    SELECT tenant, 'mem_' || id, 'remembered', ARRAY['cit_' || id], 'key_1',
           at + interval '2 seconds'
      FROM volume WHERE g % 5 = 0
    """,
    """
    INSERT INTO memory_citations (tenant, memory_id, citation_id)
    SELECT tenant, 'mem_' || id, 'cit_' || id FROM volume WHERE g % 5 = 0
    """,
    f"""
    INSERT INTO erasures (tenant, erasure_id, document_id, versions, reason, request_ref,
                          key_id, erased_at)
    SELECT tenant, 'era_' || id, 'doc_' || (g % {DOCUMENTS}), ARRAY['v1'], 'request',
           'DSR-' || id, 'key_2', at
      FROM volume WHERE g % 20 = 0
    """,
]


async def _populate(owner: AsyncEngine) -> None:
    async def run(statements: list[str]) -> None:
        async with owner.begin() as connection:
            # The rows reference each other by construction: a superuser skips the per-row
            # foreign key checks, which would double the time the load takes.
            if await connection.scalar(
                text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            ):
                await connection.execute(text("SET LOCAL session_replication_role = replica"))
            for statement in statements:
                await connection.execute(text(statement))

    await run(_RUNS)
    await asyncio.gather(run(_CITATIONS), run(_VERIFICATIONS), run(_THE_REST))
    await run(["DROP TABLE volume"])
    async with owner.connect() as connection:
        autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.execute(text("VACUUM ANALYZE"))


@dataclass
class Captured:
    """The statements sent to the server, by the label of the request that sent them."""

    label: str = ""
    statements: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)


@dataclass
class Volume:
    client: httpx.AsyncClient
    keys: Keys
    engine: AsyncEngine
    captured: Captured


@pytest.fixture
async def volume(server_url: str) -> AsyncIterator[Volume]:
    name = f"grounding_scale_{secrets.token_hex(4)}"
    await admin_execute(server_url, f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    settings = Settings(database_url=url)
    engine = create_engine(settings, request_url(settings, url))
    owner = create_async_engine(async_url(url))
    try:
        await asyncio.to_thread(migrate, url)
        app = create_app(settings)
        app.state.sessionmaker = create_sessionmaker(engine)
        keys = await make_keys(app.state.sessionmaker, tenants=("acme", "globex"))
        await _populate(owner)
        captured = Captured()

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            captured.statements.setdefault(captured.label, []).append((statement, parameters))

        event.listen(engine.sync_engine, "before_cursor_execute", capture)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://scale.test") as client:
            yield Volume(client=client, keys=keys, engine=engine, captured=captured)
    finally:
        await engine.dispose()
        await owner.dispose()
        await admin_execute(server_url, f'DROP DATABASE "{name}" WITH (FORCE)')


def _requests() -> list[tuple[str, str, dict[str, Any]]]:
    week_ago = (datetime.now(UTC) - timedelta(days=7)).isoformat()
    day_ago = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    window = {"since": week_ago, "until": day_ago}
    requests: list[tuple[str, str, dict[str, Any]]] = []
    for scope, reach in (("audit", {}), ("admin", {}), ("admin", {"tenant": "globex"})):
        requests += [
            (scope, "/v1/audit/runs", reach),
            (scope, "/v1/audit/runs", {**reach, **window}),
            (scope, "/v1/audit/runs", {**reach, "key_id": "key_7"}),
            (scope, "/v1/audit/runs", {**reach, "run_id": "run_0000010"}),
            (scope, "/v1/audit/runs", {**reach, "document_id": "doc_10"}),
            (scope, "/v1/audit/verifications", reach),
            (scope, "/v1/audit/verifications", {**reach, **window}),
            (scope, "/v1/audit/verifications", {**reach, "outcome": "refused"}),
            (scope, "/v1/audit/verifications", {**reach, "outcome": "grounded", **window}),
            (scope, "/v1/audit/verifications", {**reach, "code": "uncited_claim"}),
            (scope, "/v1/audit/verifications", {**reach, "code": "tenant_crossing"}),
            (scope, "/v1/audit/verifications", {**reach, "key_id": "key_7"}),
            (scope, "/v1/audit/verifications", {**reach, "run_id": "run_0000010"}),
            (scope, "/v1/audit/verifications", {**reach, "document_id": "doc_10"}),
            (scope, "/v1/audit/erasures", reach),
            (scope, "/v1/audit/erasures", {**reach, **window}),
            (scope, "/v1/audit/erasures", {**reach, "document_id": "doc_10"}),
            (scope, "/v1/audit/erasures", {**reach, "key_id": "key_2"}),
            # Row 10 is acme's, 11 globex's.
            (scope, f"/v1/audit/runs/run_00000{11 if reach else 10}", reach),
            (scope, "/v1/audit/stats", {**reach, **window}),
            (scope, "/v1/audit/citations", {**reach, "document_id": "doc_10", "version": "v1"}),
            (scope, "/v1/audit/citations", {**reach, "document_id": "doc_11"}),
        ]
    return requests


async def _explain(
    engine: AsyncEngine, statement: str, parameters: Any, *, admin: bool
) -> dict[str, Any]:
    async with engine.connect() as connection, connection.begin():
        await connection.execute(
            text("SELECT set_config('app.tenant', :tenant, true)"), {"tenant": "acme"}
        )
        if admin:
            await connection.execute(text(f"SET LOCAL ROLE {AUDITOR_ROLE}"))
        result = await connection.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", tuple(parameters)
        )
        [[document]] = result.all()
        plan: dict[str, Any] = document[0]["Plan"]
        return plan


async def test_every_audit_query_reads_the_big_tables_through_indexes(volume: Volume) -> None:
    pages = 0
    for number, (scope, path, params) in enumerate(_requests()):
        label = f"{number} {scope} {path} {sorted(params)}"
        volume.captured.label = label
        response = await volume.client.get(path, params=params, headers=volume.keys.headers(scope))
        assert response.status_code == 200, f"{label}: {response.text}"
        body = response.json()
        if body.get("next_cursor"):
            # The next page, whose statements resume after a key.
            volume.captured.label = f"{label} next page"
            pages += 1
            response = await volume.client.get(
                path,
                params={**params, "cursor": body["next_cursor"]},
                headers=volume.keys.headers(scope),
            )
            assert response.status_code == 200, f"{label}: {response.text}"
    assert pages >= 20, "the lists paginate at this volume"

    scanned: set[str] = set()
    problems = []
    for label, statements in volume.captured.statements.items():
        admin = " admin " in label
        for statement, parameters in statements:
            if not statement.lstrip().upper().startswith("SELECT") or "set_config" in statement:
                continue
            plan = await _explain(volume.engine, statement, parameters, admin=admin)
            for node in plan_nodes(plan):
                relation = node.get("Relation Name")
                if relation is None:
                    continue
                scanned.add(relation)
                if relation not in BIG_TABLES:
                    continue
                if node["Node Type"] == "Seq Scan":
                    problems.append(f"{label}: Seq Scan on {relation}")
                # An index that does not narrow the scan is as bad as none: it walks rows only
                # for a filter to throw them away.
                discarded = node.get("Rows Removed by Filter", 0) * node["Actual Loops"]
                if discarded > DISCARDED:
                    problems.append(f"{label}: {discarded} rows of {relation} read and discarded")
    assert problems == []
    # Every big table was read by some query, so the capture saw the statements that matter.
    assert scanned >= BIG_TABLES, sorted(BIG_TABLES - scanned)
