"""The benchmark's own parts: the floor app answers, its wrk scripts and profiles parse.

The benchmark itself is not run here: it takes many minutes and its figures are no test.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.engine import make_url

from bench import floor
from bench.load import COUNTER, Load, lua_script
from bench.profile import hot_spots
from tests.conftest import admin_execute


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
    app = floor.create_app()
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://floor") as client,
    ):
        read = await client.get("/floor/read/3")
        assert read.status_code == 200
        assert read.json()["body"]["ref"] == 3
        written = await client.post("/floor/write", json=floor.row_body(7))
        assert written.status_code == 201
        assert written.json()["ref"] == 7
        assert written.json()["id"] == 11
        assert (await client.get("/floor/read/999")).status_code == 404


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
