"""The statement pool: connections lent to reads that are their request's one statement."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import StatementPool
from app.errors import database_unreachable

PID = "SELECT pg_backend_pid() AS pid"


@pytest.fixture
async def pool(engine: AsyncEngine) -> AsyncIterator[StatementPool]:
    pool = StatementPool.for_engine(engine, size=2, timeout=0.5)
    yield pool
    await pool.close()


async def _pid(pool: StatementPool) -> int:
    [row] = await pool.fetch(PID)
    pid: int = row["pid"]
    return pid


async def test_a_read_runs_as_the_engine_connects_and_reuses_its_connection(
    pool: StatementPool,
) -> None:
    [row] = await pool.fetch("SELECT current_user AS role, $1::int + 1 AS answer", 41)

    assert (row["role"], row["answer"]) == ("grounding_app", 42)
    assert await _pid(pool) == await _pid(pool)


async def test_what_a_statement_sets_for_its_transaction_is_gone_for_the_next(
    pool: StatementPool,
) -> None:
    # Row-level security reads `app.tenant`: a lent connection must come back without it.
    [scoped] = await pool.fetch(
        "SELECT set_config('app.tenant', 'acme', true) AS tenant, pg_backend_pid() AS pid"
    )
    [after] = await pool.fetch(
        "SELECT current_setting('app.tenant', true) AS tenant, pg_backend_pid() AS pid"
    )

    assert scoped["tenant"] == "acme"
    assert after["pid"] == scoped["pid"]
    assert after["tenant"] in (None, "")


async def test_no_more_than_its_size_are_open_and_a_read_waits_for_one(
    pool: StatementPool,
) -> None:
    rows = await asyncio.gather(
        *(pool.fetch("SELECT pg_sleep(0.05), pg_backend_pid() AS pid") for _ in range(6))
    )

    assert len({row["pid"] for [row] in rows}) == 2


async def test_a_statement_is_planned_once_for_its_connection_not_on_every_run(
    engine: AsyncEngine,
) -> None:
    # Left to choose, the server plans each of the first five runs anew, and may go on so.
    pool = StatementPool.for_engine(engine, size=1, timeout=0.5)
    statement = "SELECT count(*) AS n FROM api_keys WHERE key_id = $1"
    try:
        for _ in range(3):
            await pool.fetch(statement, "key_none")
        [plans] = await pool.fetch(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
            statement,
        )
    finally:
        await pool.close()

    assert (plans["generic_plans"], plans["custom_plans"]) == (3, 0)


async def test_a_read_that_waits_past_the_timeout_is_a_database_unreachable_error(
    engine: AsyncEngine,
) -> None:
    pool = StatementPool.for_engine(engine, size=1, timeout=0.2)
    try:
        holding = asyncio.create_task(pool.fetch("SELECT pg_sleep(1)"))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolTimeoutError) as refused:
            await pool.fetch(PID)
        assert database_unreachable(refused.value)
        await holding
    finally:
        await pool.close()


async def test_a_failed_statement_is_a_database_error_and_keeps_its_connection(
    pool: StatementPool,
) -> None:
    before = await _pid(pool)

    with pytest.raises(DBAPIError) as failed:
        await pool.fetch("SELECT 1 / 0")

    assert not isinstance(failed.value, OperationalError)
    assert not database_unreachable(failed.value)
    assert await _pid(pool) == before


async def test_a_lost_connection_fails_its_read_as_unreachable_and_the_next_read_connects(
    pool: StatementPool, engine: AsyncEngine
) -> None:
    lost = await _pid(pool)
    # Terminated from the server's side, as a restart or a failover would.
    async with engine.connect() as other:
        driver = (await other.get_raw_connection()).driver_connection
        assert driver is not None
        await driver.execute(f"SELECT pg_terminate_backend({lost})")

    with pytest.raises(OperationalError) as failed:
        await pool.fetch(PID)

    assert database_unreachable(failed.value)
    assert await _pid(pool) != lost


async def test_a_cancelled_read_closes_its_connection_instead_of_lending_it_again(
    pool: StatementPool,
) -> None:
    idle = await _pid(pool)
    cancelled = asyncio.create_task(pool.fetch("SELECT pg_sleep(5)"))
    await asyncio.sleep(0.2)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled

    # The idle connection went to the cancelled read, and was closed with it.
    assert await _pid(pool) != idle


async def test_closing_closes_idle_connections_and_lent_ones_as_they_come_back(
    engine: AsyncEngine,
) -> None:
    pool = StatementPool.for_engine(engine, size=2, timeout=1)
    lent = asyncio.create_task(pool.fetch("SELECT pg_sleep(0.3), pg_backend_pid() AS pid"))
    await asyncio.sleep(0.1)
    idle = await _pid(pool)

    await pool.close()
    [row] = await lent
    await asyncio.sleep(0.2)

    assert row["pid"] != idle
    watcher = StatementPool.for_engine(engine, size=1, timeout=1)
    try:
        [open_now] = await watcher.fetch(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = ANY($1::int[])",
            [idle, row["pid"]],
        )
    finally:
        await watcher.close()
    assert open_now["n"] == 0
