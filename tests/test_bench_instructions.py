"""The in-process yardstick (`bench.instructions`): every operation it counts gets the status it
expects on a real PostgreSQL, in a scratch database that is dropped afterwards, and callgrind's
counts are read off its dumps."""

from __future__ import annotations

import asyncio
import re
import shutil

import asyncpg
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from bench.instructions import (
    ALL_OPERATIONS,
    READ_FLOOR,
    WRITE_FLOOR,
    Call,
    CpuTime,
    Prepared,
    call,
    callgrind_totals,
    main,
    measure,
    prepared_database,
    report,
)
from bench.run import libpq, server_process


async def _databases(server_url: str) -> set[str]:
    connection = await asyncpg.connect(libpq(server_url))
    try:
        return {row["datname"] for row in await connection.fetch("SELECT datname FROM pg_database")}
    finally:
        await connection.close()


def test_every_operation_is_counted_in_a_scratch_database_dropped_afterwards(
    server_url: str,
) -> None:
    before = asyncio.run(_databases(server_url))
    with prepared_database(server_url, rows=400) as prepared:
        assert make_url(prepared.url).database not in before
        assert asyncio.run(_seeded(prepared)) == (400, 400)
        postmaster = server_process(libpq(prepared.url))
        counted = asyncio.run(
            measure(
                prepared.url,
                prepared.secret,
                CpuTime(),
                names=ALL_OPERATIONS,
                requests=4,
                warmup=1,
                concurrency=2,
                postmaster=postmaster,
            )
        )
    assert asyncio.run(_databases(server_url)) == before
    assert [c.name for c in counted] == list(ALL_OPERATIONS)
    assert all(c.requests == 4 and c.amount > 0 for c in counted)
    if postmaster is not None:  # a server on this machine: its CPU time was read
        assert all(c.database is not None and c.database > 0 for c in counted)
    floors = {c.name: c.floor for c in counted}
    assert floors[READ_FLOOR] is None
    assert floors[WRITE_FLOOR] is None
    assert {floors[name] for name in ("excerpt", "resolve", "audit")} == {READ_FLOOR}
    assert {floors[name] for name in ("verify", "reject", "runs")} == {WRITE_FLOOR}
    table = report(counted, CpuTime.unit, CpuTime.scale)
    assert len(table) == 1 + len(ALL_OPERATIONS)
    for line in table[1:]:
        name = next(n for n in ALL_OPERATIONS if line.startswith(n))
        # Costs have three decimals, ratios to the floor two: one for each side, or none.
        ratios = re.findall(r" (\d+\.\d\d)(?= |$)", line)
        expected = (1 + (postmaster is not None)) if floors[name] else 0
        assert len(ratios) == expected, line


async def _seeded(prepared: Prepared) -> tuple[int, int]:
    connection = await asyncpg.connect(libpq(prepared.url))
    try:
        return (
            await connection.fetchval(
                "SELECT count(*) FROM chunks WHERE tenant = $1", prepared.tenant
            ),
            await connection.fetchval(
                "SELECT count(*) FROM citations WHERE tenant = $1", prepared.tenant
            ),
        )
    finally:
        await connection.close()


async def test_a_request_answered_otherwise_than_expected_stops_the_count() -> None:
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict[str, int]) -> dict[str, int]:
        return body

    headers = [(b"content-type", b"application/json")]
    assert await call(app, Call("POST", "/echo", b'{"a": 1}'), headers) == b'{"a":1}'
    with pytest.raises(RuntimeError, match="POST /echo: expected 200, got 422"):
        await call(app, Call("POST", "/echo", b'{"a": "one"}'), headers)
    with pytest.raises(RuntimeError, match="GET /missing: expected 200, got 404"):
        await call(app, Call("GET", "/missing"), headers)


def test_callgrind_totals_are_read_off_a_dump() -> None:
    dump = "version: 1\ncreator: callgrind-3.19.0\ndesc: Trigger: dump verify\n"
    assert callgrind_totals(dump + "summary: 0\ntotals: 70112730\n") == 70112730
    with pytest.raises(ValueError, match="no totals line"):
        callgrind_totals(dump)


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="valgrind is not installed")
def test_instructions_are_counted_under_callgrind(
    server_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    before = asyncio.run(_databases(server_url))
    main(
        [
            "--database-url",
            server_url,
            "--callgrind",
            "--rows",
            "0",
            "--operations",
            READ_FLOOR,
            "--requests",
            "20",
            "--warmup",
            "2",
        ]
    )
    printed = capfd.readouterr().out.splitlines()
    assert "M instructions/request" in printed[0]
    name, requests, per_request, _ = printed[1].rsplit(maxsplit=3)
    assert (name, requests) == (READ_FLOOR, "20")
    # The floor's read is a few hundred thousand instructions: counting ran, and only then.
    assert 0.05 < float(per_request) < 50
    assert asyncio.run(_databases(server_url)) == before
