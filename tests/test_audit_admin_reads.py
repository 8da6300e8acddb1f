"""Admin reads are in the tamper-evident log: the admin's tenant's log verifies after them, and
an admin read altered or deleted as the owner is reported at its entry. These tests commit, so
they run in a scratch database of their own, dropped afterwards."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.conftest import Committed
from tests.factories import record_run, register_version


async def _admin_reads(c: Committed) -> list[str]:
    """Runs in both tenants, then three admin reads across them; answers the reads' ids."""
    for tenant in ("acme", "globex"):
        await register_version(c.client, c.keys, tenant=tenant)
        await record_run(c.client, c.keys, tenant=tenant)
    for path, params in (
        ("/v1/audit/runs", {}),
        ("/v1/audit/verifications", {"tenant": "globex", "outcome": "rejected"}),
        ("/v1/audit/stats", {"since": "2026-01-01T00:00:00+00:00"}),
    ):
        response = await c.client.get(path, params=params, headers=c.keys.headers("admin"))
        assert response.status_code == 200, response.text
    async with c.owner.connect() as connection:
        rows = await connection.execute(text("SELECT read_id FROM admin_reads ORDER BY read_at"))
        return list(rows.scalars())


async def _integrity(c: Committed, tenant: str = "acme") -> dict[str, Any]:
    response = await c.client.get(
        "/v1/audit/integrity", headers=c.keys.headers("audit", tenant=tenant)
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _entry_of(c: Committed, record_id: str) -> tuple[str, int]:
    async with c.owner.connect() as connection:
        row = (
            await connection.execute(
                text("SELECT kind, seq FROM audit_entries WHERE record_id = :id"),
                {"id": record_id},
            )
        ).one()
        return row.kind, row.seq


async def _as_owner(c: Committed, statement: str, **params: Any) -> None:
    async with c.owner.begin() as connection:
        await connection.execute(text(statement), params)


async def test_the_log_verifies_after_admin_reads_and_covers_them(committed: Committed) -> None:
    reads = await _admin_reads(committed)
    assert len(reads) == 3
    report = await _integrity(committed)
    assert (report["ok"], report["first_bad"]) == (True, None)
    # The admin's own tenant logged one run and the three reads; globex's log has its run only.
    assert report["entries"] == 4
    assert [(await _entry_of(committed, read))[0] for read in reads] == ["admin_read"] * 3
    globex = await _integrity(committed, "globex")
    assert (globex["ok"], globex["entries"]) == (True, 1)


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ("UPDATE admin_reads SET filters = '{}'::jsonb WHERE read_id = :id", "record_altered"),
        ("UPDATE admin_reads SET route = '/v1/audit/stats' WHERE read_id = :id", "record_altered"),
        (
            "UPDATE admin_reads SET read_at = read_at + interval '1 hour' WHERE read_id = :id",
            "record_altered",
        ),
        ("DELETE FROM admin_reads WHERE read_id = :id", "record_deleted"),
    ],
)
async def test_a_tampered_admin_read_is_reported_at_its_entry(
    committed: Committed, statement: str, problem: str
) -> None:
    reads = await _admin_reads(committed)
    assert (await _integrity(committed))["ok"]
    await _as_owner(committed, statement, id=reads[1])
    report = await _integrity(committed)
    assert report["ok"] is False
    assert report["first_bad"] == {
        "seq": (await _entry_of(committed, reads[1]))[1],
        "problem": problem,
        "kind": "admin_read",
        "record_id": reads[1],
    }


async def test_the_service_role_cannot_rewrite_admin_reads(connection: AsyncConnection) -> None:
    await connection.execute(text("SELECT set_config('app.tenant', 'acme', true)"))
    for statement in ("UPDATE admin_reads SET route = 'x'", "DELETE FROM admin_reads"):
        savepoint = await connection.begin_nested()
        with pytest.raises(DBAPIError, match="permission denied"):
            await connection.execute(text(statement))
        await savepoint.rollback()
