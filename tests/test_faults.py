"""Faults, with real processes: PostgreSQL stopped under load, the service killed mid-write, and
SIGTERM with a request in flight. Each test serves `grounding serve` on an embedded PostgreSQL
of its own (tests/served.py), so stopping either touches nothing else, and checks the database
afterwards as its owner: every acknowledged write is there, and nothing is half-written.

Marked `faults`: together they take a few minutes (`pytest -m faults` runs them alone).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.factories import claim, many_chunks, results_for
from tests.served import Served, create_key, grounding, postgres_processes, serve

pytestmark = pytest.mark.faults

TENANT = "faults"
CONNECT_TIMEOUT = 2
RETRY_AFTER = 1


@dataclass
class Outcome:
    """One request of the load and how it was answered (status None: no answer at all)."""

    kind: str
    sent: float
    took: float
    status: int | None
    body: dict[str, Any] = field(default_factory=dict)
    retry_after: str | None = None

    @property
    def acknowledged(self) -> bool:
        """A write the service said it made: 2xx, or a rejected answer, recorded for audit."""
        return self.status in {200, 201} or (self.status == 422 and "verification_id" in self.body)


@dataclass
class Load:
    """A few clients writing runs and answers (and erasures) against one served instance."""

    client: httpx.AsyncClient
    documents: list[str]
    chunks: list[dict[str, Any]]
    results_per_run: int = 5
    erase: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _send(self, kind: str, method: str, path: str, **kwargs: Any) -> Outcome:
        sent = time.monotonic()
        try:
            response = await self.client.request(method, path, **kwargs)
        except httpx.TransportError:
            outcome = Outcome(kind, sent, time.monotonic() - sent, None)
        else:
            try:
                body = response.json()
            except ValueError:
                body = {}
            outcome = Outcome(
                kind,
                sent,
                time.monotonic() - sent,
                response.status_code,
                body if isinstance(body, dict) else {},
                response.headers.get("retry-after"),
            )
        self.outcomes.append(outcome)
        return outcome

    async def _client_loop(self, number: int, *, requests: int) -> None:
        for i in range(requests):
            if self.stop.is_set():
                return
            document = self.documents[(number + i) % len(self.documents)]
            start = (number * 7 + i) % (len(self.chunks) - self.results_per_run)
            run = await self._send(
                "run",
                "POST",
                "/v1/runs",
                json={
                    "query": f"client {number} request {i}",
                    "results": results_for(
                        self.chunks[start : start + self.results_per_run], document_id=document
                    ),
                },
            )
            if run.status == 201:
                citations = run.body["citations"]
                grounded = i % 3 != 0
                cited = [claim("A claim.", citations[0]["citation_id"])] if grounded else []
                await self._send(
                    "verification",
                    "POST",
                    f"/v1/runs/{run.body['run_id']}/answers",
                    json={"claims": cited or [claim("Uncited.")], "citations": citations},
                )
            if self.erase and i % 4 == 3 and len(self.documents) > 1:
                erased = self.documents.pop()
                await self._send(
                    "erasure",
                    "POST",
                    f"/v1/documents/{erased}/erase",
                    json={"reason": "fault test", "request_ref": f"DSR-{erased}"},
                )
            await asyncio.sleep(0.01)

    async def run(self, *, clients: int, requests: int) -> None:
        """Each client sends up to `requests` runs (each with an answer) until `stop` is set."""
        await asyncio.gather(*(self._client_loop(n, requests=requests) for n in range(clients)))

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]


@contextmanager
def _served(data_dir: Path, **settings: str) -> Iterator[tuple[Served, str]]:
    """A served instance with tenant `faults` and a key for ingest, agent and support."""
    environment = {
        "GROUNDING_DB_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        "GROUNDING_RETRY_AFTER": str(RETRY_AFTER),
    } | settings
    with serve(data_dir, settings=environment) as served:
        grounding(served.data_dir, "tenants", "create", TENANT)
        yield served, create_key(served.data_dir, tenant=TENANT, scopes="ingest,agent,support")


@asynccontextmanager
async def _client(served: Served, secret: str) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(
        base_url=served.base_url,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
        limits=limits,
    ) as client:
        yield client


async def _register(client: httpx.AsyncClient, documents: int, chunks: int) -> Load:
    text, spans = many_chunks(chunks)
    names = [f"doc-{i}" for i in range(documents)]
    for name in names:
        response = await client.post(
            f"/v1/documents/{name}/versions",
            json={"version": "2026-11-03", "text": text, "chunks": spans},
        )
        assert response.status_code == 201, response.text
    return Load(client=client, documents=names, chunks=spans)


async def _owner(served: Served) -> asyncpg.Connection:
    return await asyncpg.connect(host=str(served.socket_dir), user="postgres", database="postgres")


# What no committed transaction can leave behind; each query names the offending records.
INCONSISTENCIES = {
    "a run without exactly its citation_count citations": """
        SELECT r.run_id FROM runs r
         WHERE r.citation_count <> (SELECT count(*) FROM citations c
                                     WHERE c.tenant = r.tenant AND c.run_id = r.run_id)""",
    "a record without exactly one audit entry": """
        SELECT run_id FROM runs r WHERE (SELECT count(*) FROM audit_entries a WHERE
               a.tenant = r.tenant AND a.kind = 'run' AND a.record_id = r.run_id) <> 1
        UNION ALL
        SELECT verification_id FROM verifications v WHERE (SELECT count(*) FROM audit_entries a
               WHERE a.tenant = v.tenant AND a.kind = 'verification'
                 AND a.record_id = v.verification_id) <> 1
        UNION ALL
        SELECT erasure_id FROM erasures e WHERE (SELECT count(*) FROM audit_entries a WHERE
               a.tenant = e.tenant AND a.kind = 'erasure' AND a.record_id = e.erasure_id) <> 1""",
    "an audit entry without its record": """
        SELECT a.record_id FROM audit_entries a
         WHERE (a.kind = 'run' AND NOT EXISTS (SELECT 1 FROM runs r
                 WHERE r.tenant = a.tenant AND r.run_id = a.record_id))
            OR (a.kind = 'verification' AND NOT EXISTS (SELECT 1 FROM verifications v
                 WHERE v.tenant = a.tenant AND v.verification_id = a.record_id))
            OR (a.kind = 'erasure' AND NOT EXISTS (SELECT 1 FROM erasures e
                 WHERE e.tenant = a.tenant AND e.erasure_id = a.record_id))""",
    "a verification without the citations its provenance names": """
        SELECT v.verification_id FROM verifications v
         WHERE cardinality(v.provenance) <> (SELECT count(*) FROM verification_citations x
                WHERE x.tenant = v.tenant AND x.verification_id = v.verification_id)""",
    "an erasure not carried out whole": """
        SELECT e.erasure_id FROM erasures e
          JOIN document_versions d ON d.tenant = e.tenant AND d.document_id = e.document_id
                                  AND d.version = ANY(e.versions)
         WHERE d.erasure_id IS DISTINCT FROM e.erasure_id OR d.text IS NOT NULL
            OR d.sha256 IS NOT NULL
            OR EXISTS (SELECT 1 FROM chunks c WHERE c.tenant = d.tenant
                        AND c.document_id = d.document_id AND c.version = d.version
                        AND (c.text IS NOT NULL OR c.span_sha256 IS NOT NULL))
            OR EXISTS (SELECT 1 FROM version_keys k WHERE k.tenant = d.tenant
                        AND k.document_id = d.document_id AND k.version = d.version)
            OR EXISTS (SELECT 1 FROM citations c WHERE c.tenant = d.tenant
                        AND c.document_id = d.document_id AND c.document_version = d.version
                        AND c.span_sha256 IS NOT NULL)""",
    "a version marked erased without its erasure": """
        SELECT d.document_id FROM document_versions d
         WHERE d.erasure_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM erasures e
                WHERE e.tenant = d.tenant AND e.erasure_id = d.erasure_id)""",
}


async def _inconsistencies(owner: asyncpg.Connection) -> dict[str, list[str]]:
    found = {}
    for problem, query in INCONSISTENCIES.items():
        rows = await owner.fetch(query)
        if rows:
            found[problem] = [row[0] for row in rows]
    return found


async def _missing(owner: asyncpg.Connection, load: Load) -> dict[str, list[str]]:
    """Acknowledged writes that are not in the database."""
    wanted = {
        "runs": ("run_id", [o.body["run_id"] for o in load.of("run") if o.acknowledged]),
        "verifications": (
            "verification_id",
            [o.body["verification_id"] for o in load.of("verification") if o.acknowledged],
        ),
        "erasures": (
            "erasure_id",
            [o.body["erasure_id"] for o in load.of("erasure") if o.acknowledged],
        ),
    }
    missing = {}
    for table, (column, ids) in wanted.items():
        present = await owner.fetch(
            f"SELECT {column} FROM {table} WHERE tenant = $1 AND {column} = ANY($2)",
            TENANT,
            ids,
        )
        absent = sorted(set(ids) - {row[0] for row in present})
        if absent:
            missing[table] = absent
    return missing


async def _count(owner: asyncpg.Connection, table: str) -> int:
    count: int = await owner.fetchval(f"SELECT count(*) FROM {table}")
    return count


# --- the database stopped under load --------------------------------------------------------


async def test_an_outage_is_answered_503_and_the_service_recovers_by_itself(
    tmp_path: Path,
) -> None:
    with _served(tmp_path / "data") as (served, secret):
        async with _client(served, secret) as client:
            load = await _register(client, documents=3, chunks=40)
            traffic = asyncio.create_task(load.run(clients=4, requests=400))
            await asyncio.sleep(2)
            assert any(o.status == 201 for o in load.of("run")), "no load before the outage"

            await asyncio.to_thread(served.stop_database)
            down_from = time.monotonic()
            await asyncio.sleep(1)
            ready_while_down = await client.get("/readyz")
            await asyncio.sleep(3)
            down_until = time.monotonic()
            await asyncio.to_thread(served.start_database)
            up_at = time.monotonic()

            # Recovered once runs succeed again; then a little more load, and stop.
            deadline = up_at + 30
            while not [o for o in load.of("run") if o.sent > up_at and o.status == 201]:
                assert time.monotonic() < deadline, "the service did not recover by itself"
                await asyncio.sleep(0.2)
            recovered_at = time.monotonic()
            await asyncio.sleep(3)
            load.stop.set()
            await traffic
            ready_after = await client.get("/readyz")

        owner = await _owner(served)
        try:
            missing = await _missing(owner, load)
            inconsistent = await _inconsistencies(owner)
        finally:
            await owner.close()
        assert served.process.poll() is None, "the service exited: it recovered by a restart"

    statuses = {o.status for o in load.outcomes}
    assert statuses <= {200, 201, 422, 503}, f"unexpected statuses: {statuses}"
    assert all(o.status is not None for o in load.outcomes), "a request got no answer"
    during = [o for o in load.outcomes if o.sent >= down_from and o.sent + o.took <= down_until]
    assert len(during) >= 10, "too few requests while the database was down"
    assert {o.status for o in during} == {503}
    assert all(o.body.get("code") == "service_unavailable" for o in during)
    assert all(o.retry_after == str(RETRY_AFTER) for o in load.outcomes if o.status == 503)
    # Nothing hangs: an outage is answered within the connect timeout, and a bit.
    assert max(o.took for o in during) < CONNECT_TIMEOUT + 2
    assert ready_while_down.status_code == 503
    assert ready_while_down.headers["retry-after"] == str(RETRY_AFTER)
    assert ready_after.status_code == 200
    # Once it recovered, nothing failed: no connection in the pool was left dead.
    after = [o for o in load.outcomes if o.sent > recovered_at]
    assert after
    assert all(o.status in {200, 201, 422} for o in after), {o.status for o in after}
    assert all(o.acknowledged for o in after if o.status == 422)
    assert missing == {}
    assert inconsistent == {}


# --- the service killed mid-write -----------------------------------------------------------


async def test_a_killed_service_leaves_no_partial_run_verification_or_erasure(
    tmp_path: Path,
) -> None:
    with _served(tmp_path / "data") as (served, secret):
        async with _client(served, secret) as client:
            load = await _register(client, documents=24, chunks=300)
            load.results_per_run = 200  # a run is a transaction of 200 citations
            load.erase = True
            traffic = asyncio.create_task(load.run(clients=4, requests=200))
            await asyncio.sleep(3)
            served.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(served.process.wait, 30)
            load.stop.set()
            await traffic

        # The embedded PostgreSQL outlives the service: look at what it committed.
        owner = await _owner(served)
        try:
            missing = await _missing(owner, load)
            inconsistent = await _inconsistencies(owner)
            runs = await _count(owner, "runs")
            erasures = await _count(owner, "erasures")
        finally:
            await owner.close()

        # A new service on the same database serves what was acknowledged.
        with serve(served.data_dir, settings={}) as again:
            async with _client(again, secret) as client:
                acknowledged = [o.body["run_id"] for o in load.of("run") if o.acknowledged]
                read = await client.get(f"/v1/runs/{acknowledged[-1]}")

    cut = [o for o in load.outcomes if o.status is None]
    assert cut, "no request was in flight when the service was killed"
    assert {o.status for o in load.outcomes} <= {200, 201, 422, None}
    assert load.of("erasure"), "no erasure was tried"
    assert runs >= len([o for o in load.of("run") if o.acknowledged]) > 0
    assert erasures >= len([o for o in load.of("erasure") if o.acknowledged])
    assert missing == {}
    assert inconsistent == {}
    assert read.status_code == 200
    assert len(read.json()["citations"]) == 200


# --- SIGTERM: in-flight requests drain, then the embedded database stops ----------------------


@asynccontextmanager
async def _version_locked(served: Served, document_id: str) -> AsyncIterator[asyncpg.Connection]:
    """Hold a version's row FOR UPDATE, as an erasure in flight would: a run citing it waits."""
    owner = await _owner(served)
    try:
        await owner.execute("BEGIN")
        await owner.execute(
            "SELECT 1 FROM document_versions WHERE tenant = $1 AND document_id = $2 FOR UPDATE",
            TENANT,
            document_id,
        )
        yield owner
    finally:
        if not owner.is_closed():
            await owner.close()


async def _wait_for_lock_wait(owner: asyncpg.Connection) -> None:
    deadline = time.monotonic() + 20
    while not await owner.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE usename = 'grounding_app' AND wait_event_type = 'Lock'"
    ):
        assert time.monotonic() < deadline, "the run never reached the lock"
        await asyncio.sleep(0.1)


async def test_sigterm_drains_a_request_in_flight_then_stops_the_database(tmp_path: Path) -> None:
    with _served(tmp_path / "data", GROUNDING_SHUTDOWN_TIMEOUT="30") as (served, secret):
        async with _client(served, secret) as client:
            load = await _register(client, documents=1, chunks=20)
            async with _version_locked(served, "doc-0") as owner:
                slow = asyncio.create_task(
                    client.post(
                        "/v1/runs", json={"results": results_for(load.chunks, document_id="doc-0")}
                    )
                )
                await _wait_for_lock_wait(owner)
                stopped_at = time.monotonic()
                served.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(1.5)
                # Draining: no new connections, while the one in flight still waits.
                async with httpx.AsyncClient(base_url=served.base_url) as probe:
                    with pytest.raises(httpx.ConnectError):
                        await probe.get("/healthz")
                assert not slow.done()
                await owner.execute("COMMIT")
            response = await slow
        exit_status = await asyncio.to_thread(served.process.wait, 60)
        took = time.monotonic() - stopped_at
        postgres_left = postgres_processes(served.data_dir)
        log = (served.pgdata / "log").read_text(errors="replace")
        pid_file_left = (served.pgdata / "postmaster.pid").exists()
        request_lines = [
            json.loads(line)
            for line in served.log.read_text(encoding="utf-8").splitlines()
            if '"logger":"app.requests"' in line
        ]

        # The run it answered 201 was committed: a new service on the data directory has it.
        with serve(served.data_dir) as again:
            async with _client(again, secret) as client:
                read = await client.get(f"/v1/runs/{response.json()['run_id']}")

    assert response.status_code == 201, response.text
    # The drained request's line was written, as every request's is, before the worker left.
    drained = [line for line in request_lines if line["route"] == "/v1/runs"]
    assert [(d["method"], d["status"], d["tenant"]) for d in drained] == [("POST", 201, TENANT)]
    assert drained[0]["request_id"] == response.headers["x-request-id"]
    assert exit_status == 0
    assert took < 15
    assert postgres_left == []
    assert not pid_file_left
    assert "database system is shut down" in log
    assert read.status_code == 200
    assert len(read.json()["citations"]) == 20


async def test_sigterm_waits_no_longer_than_the_shutdown_timeout(tmp_path: Path) -> None:
    with _served(tmp_path / "data", GROUNDING_SHUTDOWN_TIMEOUT="2") as (served, secret):
        async with _client(served, secret) as client:
            load = await _register(client, documents=1, chunks=20)
            async with _version_locked(served, "doc-0") as owner:
                stuck = asyncio.create_task(
                    client.post(
                        "/v1/runs", json={"results": results_for(load.chunks, document_id="doc-0")}
                    )
                )
                await _wait_for_lock_wait(owner)
                stopped_at = time.monotonic()
                served.process.send_signal(signal.SIGTERM)
                exit_status = await asyncio.to_thread(served.process.wait, 60)
                took = time.monotonic() - stopped_at
            (answer,) = await asyncio.gather(stuck, return_exceptions=True)
        postgres_left = postgres_processes(served.data_dir)

        with serve(served.data_dir) as again:
            owner = await _owner(again)
            try:
                runs = await _count(owner, "runs")
                inconsistent = await _inconsistencies(owner)
            finally:
                await owner.close()

    assert exit_status == 0
    assert took < 2 + 10, "it waited past the shutdown timeout"
    # The request was cut off: a 503 that does not ask for a retry (or no answer at all, had
    # the connection gone first), and nothing committed.
    if isinstance(answer, httpx.Response):
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["code"] == "service_unavailable"
        assert "retry-after" not in answer.headers
    else:
        assert isinstance(answer, httpx.TransportError), answer
    assert runs == 0
    assert inconsistent == {}
    assert postgres_left == []
