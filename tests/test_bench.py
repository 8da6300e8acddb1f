"""The benchmark's own parts: the floor app answers, its wrk scripts and profiles parse, the open
loop keeps its rate, and the seeder writes rows the service reads, cites and verifies as its own.

The benchmark itself is not run here: it takes many minutes and its figures are no test.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import hmac
import itertools
import secrets
import time
from collections import namedtuple
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, replace
from typing import Any

import asyncpg
import psutil
import pytest
from sqlalchemy.engine import make_url

from bench import floor, payloads, seed
from bench.load import (
    COUNTER,
    Load,
    Measurement,
    constant_rate,
    lua_script,
    slow_spells,
    tenths_p50_ms,
)
from bench.profile import hot_spots
from bench.run import (
    Block,
    Check,
    OpenLoop,
    OperationResult,
    Pair,
    Timed,
    WorkerComparison,
    checks,
    cpu_waited_seconds,
    database_cpu_seconds,
    psi_some_total,
    server_process,
    stolen_share,
    waited_share,
)
from tests.conftest import Committed, admin_execute, serving


def a_block(*results: OperationResult, workers: int = 1, **fields: Any) -> Block:
    """A block at 10,000 of `results`, by key."""
    made = {r.key: r for r in results}
    return Block(scale=10_000, workers=workers, rows_before={}, results=made, **fields)


@pytest.fixture
async def floor_url(server_url: str) -> AsyncIterator[str]:
    """A database of its own, so the floor's table never meets the service's schema."""
    name = f"bench_floor_{secrets.token_hex(4)}"
    await admin_execute(server_url, f"CREATE DATABASE {name}")
    try:
        url = make_url(server_url).set(drivername="postgresql", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        await admin_execute(server_url, f"DROP DATABASE {name} WITH (FORCE)")


async def test_floor_reads_by_primary_key_and_writes_in_one_transaction(
    floor_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await floor.prepare(floor_url, rows=10)
    monkeypatch.setenv(floor.URL_VARIABLE, floor_url)
    monkeypatch.setenv(floor.POOL_VARIABLE, "2")
    async with serving(floor.create_app(), "http://floor") as client:
        read = await client.get("/floor/read/3")
        assert read.status_code == 200
        assert read.json()["body"]["ref"] == 3
        written = await client.post("/floor/write", json=floor.row_body(7))
        assert written.status_code == 201
        assert written.json()["ref"] == 7
        assert written.json()["id"] == 11
        assert (await client.get("/floor/read/999")).status_code == 404
        # A connection given back is not reset (asyncpg's default sends `RESET ALL` and three
        # more statements): its last statement is the route's own.
        watcher = await asyncpg.connect(floor_url)
        try:
            last = await watcher.fetch(
                "SELECT query FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await watcher.close()
        assert last
        assert all(row["query"].startswith(("SELECT id", "INSERT", "COMMIT")) for row in last)


def test_wrk_script_rotates_requests_and_reports_percentiles() -> None:
    script = lua_script(
        Load("POST", (("/a", '{"x": "]]"}'), ("/b", None)), {"Authorization": "Bearer k"})
    )
    assert "formatted[counter]" in script
    assert '[=[{"x": "]]"}]=]' in script
    assert "latency:percentile(99)" in script


def test_wrk_script_puts_a_fresh_value_in_each_countered_body() -> None:
    script = lua_script(Load("POST", (("/v", f'{{"version": "{COUNTER}"}}'),), tag="t1"))
    assert "prefix .. value .. suffix" in script
    assert COUNTER not in script


async def open_loop_of_100(on_request: Callable[[], None]) -> Measurement:
    """The open loop at 200 requests/s for half a second against a server in this event loop,
    which calls `on_request` as each request arrives and answers it 200."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                on_request()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass  # the loop is done and closed its connection
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await constant_rate(
            "127.0.0.1", port, Load("GET", (("/x", None),)), rate=200, seconds=0.5, connections=4
        )
    finally:
        server.close()
        await server.wait_closed()


async def test_the_open_loop_sends_at_its_rate_and_no_collection_runs_while_it_times() -> None:
    collecting: list[bool] = []
    measured = await open_loop_of_100(lambda: collecting.append(gc.isenabled()))

    assert measured.requests == 100
    assert measured.errors == measured.unexpected == 0
    assert 0 < measured.p50_ms <= measured.p99_ms
    assert collecting == [False] * 100
    assert gc.isenabled()
    assert measured.slow is not None
    assert 0 <= measured.slow.share <= 1
    assert measured.own_cpu_share is not None
    assert measured.own_cpu_share > 0
    assert measured.late_ms is not None
    assert measured.late_ms >= 0


async def test_the_open_loop_says_how_late_it_sent_when_it_was_held_up() -> None:
    answered = 0

    def hold_up_the_twentieth() -> None:
        nonlocal answered
        answered += 1
        if answered == 20:
            # The generator shares this event loop: blocking it holds the generator up.
            time.sleep(0.3)

    measured = await open_loop_of_100(hold_up_the_twentieth)

    assert measured.requests == 100
    assert measured.late_ms is not None
    assert measured.late_ms >= 250


async def test_the_open_loop_shows_a_backlog_growing_behind_a_server_slower_than_its_rate() -> None:
    # 8 ms a request against one due every 5 ms: each waits behind all the ones before it.
    measured = await open_loop_of_100(lambda: time.sleep(0.008))

    tenths = measured.tenths_p50_ms
    assert len(tenths) == 10
    assert all(earlier < later for earlier, later in itertools.pairwise(tenths))
    # The last tenth waits behind about 90 requests' 3 ms shortfall each.
    assert tenths[-1] > 100
    assert tenths[-1] > 4 * tenths[0]


def test_the_tenths_are_of_due_order_not_of_answer_order() -> None:
    # Due at 0..19 (out of order), each answered after its due time in seconds over 100.
    timed = [(float(due), due / 100) for due in reversed(range(20))]
    tenths = tenths_p50_ms(timed)
    assert tenths[0] == pytest.approx(5.0)  # the median of 0 and 10 ms
    assert tenths[-1] == pytest.approx(185.0)  # of 180 and 190 ms
    assert len(tenths) == 10
    # 25 requests: tenths of two or three, none left out.
    assert tenths_p50_ms([(float(due), due / 1000) for due in range(25)])[-1] == pytest.approx(23.0)
    assert tenths_p50_ms([(0.0, 0.001), (1.0, 0.003)]) == ()


def test_slow_requests_in_a_row_are_one_spell_from_first_due_to_last_answer() -> None:
    timed = [
        (0.00, 0.001),
        (0.01, 0.050),  # a spell of three: due at 0.01, the last answered at 0.03 + 0.030
        (0.02, 0.040),
        (0.03, 0.030),
        (0.04, 0.001),
        (0.05, 0.020),  # a spell of one, alone: its own latency
    ]
    # Completion order is not due order: the spells follow due times.
    found = slow_spells(list(reversed(timed)), bound=0.010)
    assert found.spells == 2
    assert found.longest_ms == pytest.approx(50.0)
    assert found.share == pytest.approx(4 / 6)


def test_an_open_loop_with_no_slow_request_has_no_spell() -> None:
    found = slow_spells([(0.0, 0.001), (0.01, 0.002)], bound=0.010)
    assert (found.spells, found.longest_ms, found.share) == (0, 0.0, 0.0)
    assert slow_spells([], bound=0.010).share == 0.0


def test_hot_spots_count_own_and_total_samples_by_function() -> None:
    collapsed = "\n".join(
        [
            "run (asyncio/runners.py:10);handle (app/x/service.py:5);hash (hashlib.py:1) 3",
            "run (asyncio/runners.py:10);handle (app/x/service.py:7) 1",
        ]
    )
    found = hot_spots(collapsed)
    assert found.samples == 4
    assert found.by_own[0].function == "hash (hashlib.py)"
    assert found.by_own[0].own == 75.0
    assert [h.function for h in found.by_total_in_app] == ["handle (app/x/service.py)"]
    assert found.by_total_in_app[0].total == 100.0
    assert [(h.function, h.own) for h in found.by_package] == [("hashlib", 75.0), ("app", 25.0)]


# Every foreign key of the seeded tables, and each citation's pin against its chunk's.
_ORPHANS = (
    "SELECT count(*) FROM chunks c LEFT JOIN document_versions v"
    " USING (tenant, document_id, version) WHERE v.tenant IS NULL",
    "SELECT count(*) FROM version_keys k LEFT JOIN document_versions v"
    " USING (tenant, document_id, version) WHERE v.tenant IS NULL",
    "SELECT count(*) FROM citations c LEFT JOIN runs r USING (tenant, run_id)"
    " WHERE r.tenant IS NULL",
    "SELECT count(*) FROM citations c LEFT JOIN chunks k ON (k.tenant, k.document_id,"
    " k.version, k.chunk_id, k.span_start, k.span_end, k.utf8_start, k.utf8_end,"
    " k.utf16_start, k.utf16_end, k.page, k.section, k.span_sha256, k.span_hmac)"
    " = (c.tenant, c.document_id, c.document_version, c.chunk_id, c.span_start, c.span_end,"
    " c.utf8_start, c.utf8_end, c.utf16_start, c.utf16_end, c.page, c.section,"
    " c.span_sha256, c.span_hmac) WHERE k.tenant IS NULL",
    "SELECT count(*) FROM audit_entries a LEFT JOIN runs r"
    " ON (r.tenant, r.run_id) = (a.tenant, a.record_id) WHERE r.tenant IS NULL",
    *(
        f"SELECT count(*) FROM {table} x LEFT JOIN tenants t ON t.name = x.tenant"
        " WHERE t.name IS NULL"
        for table in seed.SEEDED_TABLES
    ),
)


async def test_seeded_rows_are_the_services_own(
    committed: Committed, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = committed.owner.url.set(drivername="postgresql").render_as_string(hide_password=False)
    connection = await asyncpg.connect(owner)
    try:
        key_id = await connection.fetchval(
            "SELECT key_id FROM api_keys WHERE tenant = 'acme' AND 'agent' = ANY(scopes)"
        )
        # One version a batch, so both connections write, in two steps as the benchmark does.
        monkeypatch.setattr(seed, "VERSIONS_PER_BATCH", 1)
        seeder = seed.Seeder(tenant="acme", key_id=key_id)
        first = await seeder.seed(owner, chunks=600, citations=300)
        second = await seeder.seed(owner, chunks=200, citations=100)
        assert (first.versions, first.chunks, first.runs, first.citations) == (3, 600, 15, 300)
        assert (second.chunks, second.citations) == (200, 100)
        for orphans in _ORPHANS:
            assert await connection.fetchval(orphans) == 0, orphans
        chunks = await connection.fetch(
            "SELECT c.*, v.text AS version_text, v.sha256 AS version_sha256, k.hmac_key"
            " FROM chunks c JOIN document_versions v USING (tenant, document_id, version)"
            " JOIN version_keys k USING (tenant, document_id, version)"
        )
        assert len(chunks) == 800
        assert await connection.fetchval("SELECT count(*) FROM citations") == 400
        cited = await connection.fetch(
            "SELECT c.citation_id, k.text FROM citations c JOIN chunks k"
            " ON (k.tenant, k.document_id, k.version, k.chunk_id)"
            " = (c.tenant, c.document_id, c.document_version, c.chunk_id) LIMIT 3"
        )
    finally:
        await connection.close()
    for chunk in chunks:
        text, whole = chunk["text"], chunk["version_text"]
        encoded = text.encode("utf-8")
        assert whole[chunk["span_start"] : chunk["span_end"]] == text
        assert len(whole[: chunk["span_start"]].encode("utf-8")) == chunk["utf8_start"]
        assert chunk["utf8_end"] - chunk["utf8_start"] == len(encoded)
        assert len(whole[: chunk["span_end"]].encode("utf-16-le")) // 2 == chunk["utf16_end"]
        assert chunk["span_sha256"] == hashlib.sha256(encoded).hexdigest()
        assert chunk["span_hmac"] == hmac.digest(chunk["hmac_key"], encoded, "sha256").hex()
        assert chunk["version_sha256"] == hashlib.sha256(whole.encode("utf-8")).hexdigest()

    client, keys = committed.client, committed.keys
    integrity = await client.get("/v1/audit/integrity", headers=keys.headers("audit"))
    assert integrity.status_code == 200, integrity.text
    assert (integrity.json()["ok"], integrity.json()["entries"]) == (True, 20)
    assert len(cited) == 3
    for row in cited:
        excerpt = await client.get(
            f"/v1/citations/{row['citation_id']}/excerpt", headers=keys.headers("agent")
        )
        assert excerpt.status_code == 200, excerpt.text
        assert excerpt.json()["text"] == row["text"]
    spans = [
        payloads.ChunkSpan(
            document_id=c["document_id"],
            version=c["version"],
            chunk_id=c["chunk_id"],
            start=c["span_start"],
            end=c["span_end"],
        )
        for c in chunks[:20]
    ]
    again = await client.post(
        "/v1/runs", json=payloads.run_body(spans), headers=keys.headers("agent")
    )
    assert again.status_code == 201, again.text


def test_cpu_per_request_and_its_ratio_to_the_floor_are_taken_repeat_by_repeat() -> None:
    def measured(requests: int) -> Measurement:
        return Measurement(requests, 10.0, 1.0, 2.0, 0, 0)

    result = OperationResult("verify", "verify", "write")
    # Floor 1 ms and the operation 4 ms per request; then 2 ms and 5 ms; then 1 ms and 2 ms.
    result.pairs += [
        Pair(measured(1000), measured(250), floor_cpu=1.0, operation_cpu=1.0),
        Pair(measured(1000), measured(200), floor_cpu=2.0, operation_cpu=1.0),
        Pair(measured(500), measured(500), floor_cpu=0.5, operation_cpu=1.0),
    ]

    assert [p.operation_cpu_ms for p in result.pairs] == [4.0, 5.0, 2.0]
    assert result.cpu_ms == 4.0
    assert result.cpu_ratio == 0.4  # the middle of 0.25, 0.4 and 0.5
    assert Pair(measured(0), measured(0), 1.0, 1.0).operation_cpu_ms == 0.0
    assert result.database_cpu_ms is None  # no server's figures: none is made up
    result.pairs = [
        Pair(measured(100), measured(100), 1.0, 1.0, 0.1, operation_database_cpu=spent)
        for spent in (0.3, 0.1, 0.2)
    ]
    assert result.database_cpu_ms == 2.0
    assert result.pairs[0].floor_database_cpu_ms == 1.0


def test_the_scale_check_holds_each_sizes_p50_against_its_own_floors() -> None:
    def block(scale: int, floor_p50: float, verify_p50: float, runs_p50: float) -> Block:
        def result(key: str, p50: float) -> OperationResult:
            made = OperationResult(key, key, "write")
            made.pairs.append(
                Pair(
                    Measurement(1000, 10.0, floor_p50, 2 * floor_p50, 0, 0),
                    Measurement(250, 10.0, p50, 2 * p50, 0, 0),
                    floor_cpu=1.0,
                    operation_cpu=1.0,
                )
            )
            return made

        return Block(
            scale=scale,
            workers=1,
            rows_before={},
            results={"verify": result("verify", verify_p50), "runs": result("runs", runs_p50)},
        )

    # The machine is a third slower at the large size (the floor too); runs grew no more than
    # that, verification grew half again beyond it.
    found = {
        c.target.split(":")[0]: c
        for c in checks([block(10_000, 1.0, 4.0, 5.0), block(1_000_000, 1.3, 7.8, 6.5)], [])
        if "p50 at" in c.target
    }

    assert found["[1w] runs"].passed
    assert found["[1w] runs"].found == "1.000 (raw 1.30)"
    assert not found["[1w] verify"].passed
    assert found["[1w] verify"].found == "1.500 (raw 1.95)"
    # Just over the bound, and shown so.
    (over,) = [
        c
        for c in checks([block(10_000, 1.0, 4.0, 4.0), block(1_000_000, 1.0, 5.0048, 4.0)], [])
        if c.target.startswith("[1w] verify: p50 at")
    ]
    assert not over.passed
    assert over.found == "1.251 (raw 1.25)"


def growing(first: float, last: float) -> tuple[float, ...]:
    """Ten medians rising evenly from `first` to `last`."""
    return tuple(first + (last - first) * k / 9 for k in range(10))


def test_the_tail_check_is_the_operations_own_with_its_floors_tail_beside_it() -> None:
    def loop(
        rate: float,
        served: float,
        p50: float,
        p99: float,
        failed: int = 0,
        tenths: tuple[float, ...] = (),
        saturated_p50: float | None = None,
    ) -> OpenLoop:
        measured = Measurement(round(10 * served), 10.0, p50, p99, failed, 0)
        return OpenLoop(
            rate, replace(measured, tenths_p50_ms=tenths), saturated_p50_ms=saturated_p50
        )

    def result(key: str, kind: str, measured: OpenLoop) -> OperationResult:
        made = OperationResult(key, key, kind)
        made.pairs.append(Pair(measured.measured, measured.measured, 1.0, 1.0))
        made.open_loop = measured
        return made

    block = a_block(
        result("excerpt", "read", loop(100.0, 100.0, 1.0, 3.5)),
        result("verify", "write", loop(100.0, 100.0, 2.0, 10.0)),
        # Within the ratio, but it fell behind its rate: not a pass.
        result("runs", "write", loop(100.0, 90.0, 2.0, 6.0)),
        result("resolve", "read", loop(100.0, 100.0, 2.0, 6.0, failed=1)),
        # 96% served, within the ratio, and its latency grew all along: a queue, not a pass.
        result("audit", "read", loop(100.0, 96.0, 200.0, 380.0, tenths=growing(20.0, 370.0))),
        # Rising all along to four and a half times as slow, but by less than a millisecond.
        result("reject", "write", loop(100.0, 100.0, 0.3, 1.0, tenths=growing(0.2, 0.9))),
        # Behind for most of the loop, caught up at its end: half its requests queued deeper
        # than with every connection busy at the full rate, so its p99 / p50 is not a tail.
        result(
            "memory",
            "write",
            loop(100.0, 99.0, 250.0, 500.0, tenths=(80.0, 230.0, 370.0, 120.0), saturated_p50=80.0),
        ),
        # Queued most of the time, at 0.7 of the full rate's p50 (a run's 0.68-0.90), where
        # waiting behind half as many requests as every connection's flattens p99 / p50.
        result(
            "documents",
            "write",
            loop(100.0, 99.0, 56.0, 140.0, tenths=(95.0, 20.0, 60.0, 80.0), saturated_p50=80.0),
        ),
        # Well under the full rate's p50 (a run's 0.04-0.30): the server kept up.
        result("erase", "write", loop(100.0, 100.0, 24.0, 72.0, saturated_p50=80.0)),
        # A spell at the end, however long, is a tail, not a backlog: it fails as a tail.
        result("register", "write", loop(100.0, 100.0, 2.0, 40.0, tenths=(2.0,) * 9 + (60.0,))),
        floor_open_loops={"read": loop(700.0, 700.0, 1.0, 12.5), "write": loop(500, 500, 1.0, 3.0)},
    )

    found = {c.target.split(":")[0]: c for c in checks([block], []) if "p99" in c.target}

    assert found["[1w, 10,000] excerpt"].passed  # the floor's own tail fails; it is shown only
    assert found["[1w, 10,000] excerpt"].found == "3.50 (the read floor's own: 12.50)"
    assert not found["[1w, 10,000] verify"].passed
    assert found["[1w, 10,000] verify"].found == "5.00 (the write floor's own: 3.00)"
    assert not found["[1w, 10,000] runs"].passed
    assert found["[1w, 10,000] runs"].found == (
        "3.00 (did not keep up: 90.0 of 100.0 req/s served, 0 failed) (the write floor's own: 3.00)"
    )
    assert not found["[1w, 10,000] resolve"].passed
    assert "1 failed" in found["[1w, 10,000] resolve"].found
    assert not found["[1w, 10,000] audit"].passed
    assert found["[1w, 10,000] audit"].found == (
        "1.90 (did not keep up: 96.0 of 100.0 req/s served, 0 failed, p50 rising from 20.00 ms in"
        " the first tenth of the requests to 370.00 ms in the last) (the read floor's own: 12.50)"
    )
    assert found["[1w, 10,000] reject"].passed
    assert not found["[1w, 10,000] register"].passed
    assert not found["[1w, 10,000] memory"].passed
    assert found["[1w, 10,000] memory"].found == (
        "2.00 (did not keep up: 99.0 of 100.0 req/s served, 0 failed, p50 250.00 ms over 0.5 x"
        " the 80.00 ms of the closed loop at the full rate) (the write floor's own: 3.00)"
    )
    assert not found["[1w, 10,000] documents"].passed
    assert found["[1w, 10,000] erase"].passed
    assert found["[1w, 10,000] register"].found == "20.00 (the write floor's own: 3.00)"
    # A floor's loop that queued deeper than its closed loop's p50 shows no tail of its own.
    block.floor_open_loops["write"] = loop(500.0, 490.0, 250.0, 545.0, saturated_p50=24.0)
    queued = {c.target.split(":")[0]: c for c in checks([block], []) if "p99" in c.target}
    assert queued["[1w, 10,000] verify"].found == (
        "5.00 (the write floor's own: 2.18, its loop did not keep up)"
    )
    assert queued["[1w, 10,000] excerpt"].found == "3.50 (the read floor's own: 12.50)"
    # With no floor loop (the check skipped, or an older run), the operation's figure alone.
    block.floor_open_loops.clear()
    alone = {c.target.split(":")[0]: c for c in checks([block], []) if "p99" in c.target}
    assert alone["[1w, 10,000] excerpt"].found == "3.50"


def test_a_floors_rate_is_the_median_over_every_repeat_held_against_it() -> None:
    def result(key: str, kind: str, floor_rates: list[int]) -> OperationResult:
        made = OperationResult(key, key, kind)
        made.pairs += [
            Pair(
                Measurement(rate * 10, 10.0, 1.0, 2.0, 0, 0),
                Measurement(10, 10.0, 1, 2, 0, 0),
                1,
                1,
            )
            for rate in floor_rates
        ]
        return made

    block = a_block(
        result("excerpt", "read", [900, 1000]),
        result("resolve", "read", [1100]),
        result("verify", "write", [400, 500, 600]),
    )

    assert block.floor_median("read", lambda m: m.rps) == 1000.0
    assert block.floor_median("write", lambda m: m.rps) == 500.0


def test_the_two_worker_check_takes_alternate_pairs_and_says_what_the_cores_allow() -> None:
    def timed(rps: float, worker: float, database: float | None, generator: float) -> Timed:
        # Ten seconds each.
        return Timed(
            Measurement(round(10 * rps), 10.0, 1.0, 2.0, 0, 0), worker, database, 0.0, generator
        )

    def two_worker_check(*pairs: tuple[Timed, Timed]) -> Check:
        comparison = WorkerComparison(scale=10_000, pairs=list(pairs))
        (found,) = [c for c in checks([], [], [comparison], cores=2) if "two workers" in c.target]
        return found

    # One worker kept (9 + 11 + 10) / 30 = 1.0 + (3 + 5 + 4) / 30 = 0.4 + 0.1 = 1.5 cores busy:
    # two cores allow 1.33 x at most. The pairs' ratios are 1.25, 1.1 and 2.0, whose median is
    # 1.25; the medians of each side's rates would give 400 / 300 = 1.33.
    found = two_worker_check(
        (timed(300, 9.0, 3.0, 1.0), timed(375, 19.0, 6.0, 1.0)),
        (timed(400, 11.0, 5.0, 1.0), timed(440, 20.0, 6.0, 1.0)),
        (timed(200, 10.0, 4.0, 1.0), timed(400, 20.0, 6.0, 1.0)),
    )
    assert found.target == (
        "[10,000] two workers >= 1.6 x one worker's verification req/s (loaded alternately)"
    )
    assert not found.passed
    assert found.found == (
        "1.25 (one worker's load kept 1.50 of the 2 cores busy: the worker 1.00, PostgreSQL"
        " 0.40, wrk 0.10; so the cores allow at most 1.33 x)"
    )
    assert two_worker_check((timed(300, 9.0, 3.0, 1.0), timed(480, 19.0, 6.0, 1.0))).passed
    # `--json` keeps each load's figures by name.
    kept = asdict(
        WorkerComparison(10_000, [(timed(300, 9.0, 3.0, 1.0), timed(480, 19.0, 6.0, 1.0))])
    )
    assert kept["pairs"][0][1]["cpu"] == 19.0
    assert kept["pairs"][0][1]["measured"]["requests"] == 4800
    # PostgreSQL on another machine: its share is not known, and not made up.
    assert two_worker_check((timed(300, 10.0, None, 1.0), timed(375, 19.0, None, 1.0))).found == (
        "1.25 (one worker's load kept 1.10 of the 2 cores busy: the worker 1.00, PostgreSQL not"
        " on this machine, wrk 0.10; so the cores allow at most 1.82 x)"
    )


# `psutil.cpu_times()` as Linux gives it, and as a system that counts no steal gives it.
Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
Uncounted = namedtuple("Uncounted", "user system idle")


def test_waits_for_a_core_are_read_from_the_pressure_file_or_unknown() -> None:
    pressure = (
        "\n"  # a blank line is passed over
        "some avg10=1.50 avg60=0.80 avg300=0.20 total=2500000\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=100\n"
    )
    assert psi_some_total(pressure) == 2.5
    with pytest.raises(ValueError, match="no 'some' line"):
        psi_some_total("full avg10=0.00 avg60=0.00 avg300=0.00 total=100\n")
    with pytest.raises(ValueError, match="no 'some' line"):
        psi_some_total("some avg10=0.00\n")
    # 1.5 s of waiting in a 5 s loop.
    assert waited_share(2.5, 4.0, 5.0) == pytest.approx(0.3)
    assert waited_share(None, 4.0, 5.0) is None
    assert waited_share(2.5, 4.0, 0.0) is None
    waited = cpu_waited_seconds()
    assert waited is None or waited >= 0.0


def test_stolen_time_is_a_share_of_the_machines_time_and_unknown_where_uncounted() -> None:
    before = Times(10, 0, 5, 100, 1, 0, 0, 2, 4, 0)
    # 6 s of user time (3 of them a guest's, counted in user too), 2 system, 8 idle, 4 stolen.
    after = Times(16, 0, 7, 108, 1, 0, 0, 6, 7, 0)
    assert stolen_share(before, after) == 0.2
    assert stolen_share(before, before) is None  # no time passed: no share to give
    assert stolen_share(Uncounted(1, 1, 1), Uncounted(2, 2, 2)) is None  # none made up
    share = stolen_share(psutil.cpu_times(), psutil.cpu_times())
    assert share is None or 0.0 <= share <= 1.0

    def measured() -> Measurement:
        return Measurement(100, 10.0, 1.0, 2.0, 0, 0)

    result = OperationResult("verify", "verify", "write")
    result.pairs = [
        Pair(measured(), measured(), 1.0, 1.0, floor_stolen=0.0, operation_stolen=stolen)
        for stolen in (0.3, 0.1, 0.2)
    ]
    assert result.stolen == 0.2
    result.pairs.append(Pair(measured(), measured(), 1.0, 1.0))
    assert result.stolen is None


def test_the_database_servers_cpu_is_read_off_its_processes(floor_url: str) -> None:
    postmaster = server_process(floor_url)
    assert postmaster is not None
    before = database_cpu_seconds(postmaster)

    async def busy_backend() -> None:
        connection = await asyncpg.connect(floor_url)
        try:
            await connection.fetchval("SELECT count(*) FROM generate_series(1, 2000000)")
            pid: int = await connection.fetchval("SELECT pg_backend_pid()")
            after = database_cpu_seconds(postmaster)
        finally:
            await connection.close()
        assert before is not None
        assert after is not None
        # A backend that began after the first reading: all of its time counts.
        assert pid not in before
        assert after[pid] > 0.05

    asyncio.run(busy_backend())
