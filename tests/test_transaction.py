"""The request's transaction on the driver: one transaction from its first statement to its
end, and a connection given back to the pool only when that end completed."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Transaction
from app.errors import database_unreachable
from tests.conftest import Committed
from tests.factories import claim, record_run, register_version

BEGAN = "SELECT now() AS began, pg_backend_pid() AS pid"
XID = "SELECT pg_current_xact_id()::text AS xid, pg_backend_pid() AS pid"


async def _outside(engine: AsyncEngine, statement: str, *arguments: object) -> object:
    """The one value `statement` reads on a connection of its own, outside the pool."""
    _, connect_arguments = engine.dialect.create_connect_args(engine.url)
    connection = await asyncpg.connect(**connect_arguments)
    try:
        return await connection.fetchval(statement, *arguments)
    finally:
        await connection.close()


async def _xact_status(engine: AsyncEngine, xid: str) -> object:
    return await _outside(engine, "SELECT pg_xact_status($1::text::xid8)", xid)


async def _backend_state(engine: AsyncEngine, pid: int) -> object:
    """The state of backend `pid` (None once it is gone)."""
    return await _outside(engine, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid)


async def test_its_statements_share_one_transaction_and_what_the_first_sets(
    engine: AsyncEngine,
) -> None:
    transaction = Transaction(engine)
    try:
        [first] = await transaction.fetch(
            "SELECT now() AS began, set_config('app.tenant', 'acme', true) AS tenant"
        )
        await asyncio.sleep(0.01)
        [second] = await transaction.fetch(
            "SELECT now() AS began, current_setting('app.tenant') AS tenant"
        )
    finally:
        await transaction.rollback()

    assert second["began"] == first["began"]
    assert second["tenant"] == "acme"


@pytest.mark.parametrize(("end", "status"), [("commit", "committed"), ("rollback", "aborted")])
async def test_its_end_decides_its_work_and_gives_the_connection_back_idle(
    engine: AsyncEngine, end: str, status: str
) -> None:
    transaction = Transaction(engine)
    [row] = await transaction.fetch(XID)
    assert transaction.in_transaction()

    await getattr(transaction, end)()

    assert not transaction.in_transaction()
    assert await _xact_status(engine, row["xid"]) == status
    assert await _backend_state(engine, row["pid"]) == "idle"


async def test_a_failed_statement_is_a_database_error_and_its_rollback_keeps_the_connection(
    engine: AsyncEngine,
) -> None:
    transaction = Transaction(engine)
    [row] = await transaction.fetch(XID)

    with pytest.raises(DBAPIError) as failed:
        await transaction.fetch("SELECT 1 / 0")
    await transaction.rollback()

    assert not database_unreachable(failed.value)
    assert await _xact_status(engine, row["xid"]) == "aborted"
    assert await _backend_state(engine, row["pid"]) == "idle"


async def test_a_lost_connection_is_unreachable_and_a_commit_after_it_is_refused(
    engine: AsyncEngine,
) -> None:
    transaction = Transaction(engine)
    [row] = await transaction.fetch(XID)
    # Terminated from the server's side, as a restart or a failover would.
    await _outside(engine, "SELECT pg_terminate_backend($1)", row["pid"])

    with pytest.raises(OperationalError) as lost:
        await transaction.fetch(BEGAN)
    with pytest.raises(OperationalError) as committing:
        await transaction.commit()

    assert database_unreachable(lost.value)
    assert database_unreachable(committing.value)
    assert await _xact_status(engine, row["xid"]) == "aborted"
    # The pool lends a live connection next: the lost one was not given back.
    async with engine.connect() as connection:
        driver = (await connection.get_raw_connection()).driver_connection
        assert driver is not None
        assert await driver.fetchval("SELECT 1") == 1


async def test_a_cancelled_statement_never_leaves_a_connection_in_a_transaction(
    engine: AsyncEngine,
) -> None:
    transaction = Transaction(engine)
    [row] = await transaction.fetch(XID)
    sleeping = asyncio.create_task(transaction.fetch("SELECT pg_sleep(5)"))
    await asyncio.sleep(0.2)
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping

    # A rollback the cancellation left undone fails, and closes the connection instead.
    with contextlib.suppress(DBAPIError):
        await transaction.rollback()

    assert await _xact_status(engine, row["xid"]) == "aborted"
    for _ in range(50):
        if await _backend_state(engine, row["pid"]) in (None, "idle"):
            break
        await asyncio.sleep(0.05)
    assert await _backend_state(engine, row["pid"]) in (None, "idle")


async def test_a_statement_after_the_end_is_refused(engine: AsyncEngine) -> None:
    transaction = Transaction(engine)
    await transaction.fetch(BEGAN)
    await transaction.commit()

    with pytest.raises(RuntimeError, match="has ended"):
        await transaction.fetch(BEGAN)


async def test_an_end_with_no_statement_takes_no_connection(engine: AsyncEngine) -> None:
    checked_out = engine.pool.checkedout()  # type: ignore[attr-defined]
    transaction = Transaction(engine)

    await transaction.commit()

    assert not transaction.in_transaction()
    assert engine.pool.checkedout() == checked_out  # type: ignore[attr-defined]


async def test_writes_on_the_driver_leave_no_connection_in_a_transaction(
    committed: Committed,
) -> None:
    client, keys = committed.client, committed.keys
    await register_version(client, keys)
    run = await record_run(client, keys)
    agent = keys.headers("agent")
    cited = run["citations"][0]
    grounded = {"claims": [claim("Refunds.", cited["citation_id"])], "citations": [cited]}
    rejected = {"claims": [claim("Refunds.", "cit_not_carried")], "citations": [cited]}
    answers = f"/v1/runs/{run['run_id']}/answers"
    responses = [
        await client.post(answers, json=grounded, headers=agent),
        await client.post(answers, json=rejected, headers=agent),
        await client.post("/v1/runs/run_none/answers", json=grounded, headers=agent),
        await client.post("/v1/runs", json={"results": [{"document_id": "x"}]}, headers=agent),
        await client.post("/v1/runs", json={"results": []}, headers=keys.headers("support")),
    ]

    assert [r.status_code for r in responses] == [200, 422, 404, 422, 403]
    in_transaction = await _outside(
        committed.owner,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    assert in_transaction == 0
    # The rejection was recorded, and its record committed with it.
    recorded = await _outside(
        committed.owner,
        "SELECT outcome FROM verifications WHERE verification_id = $1",
        responses[1].json()["verification_id"],
    )
    assert recorded == "rejected"


async def test_jsonb_is_read_as_the_standard_library_reads_it(engine: AsyncEngine) -> None:
    # The engine's decoder is orjson's where it reads as `json` does: an integer past 64 bits
    # stays an integer, not orjson's float.
    async with engine.connect() as connection:
        read = await connection.exec_driver_sql(
            'SELECT \'{"n": 123456789012345678901234567890, "x": 0.82}\'::jsonb'
        )
        assert read.scalar_one() == {"n": 123456789012345678901234567890, "x": 0.82}
