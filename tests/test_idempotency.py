"""`Idempotency-Key` on the writes over HTTP: replayed, refused when reused, per tenant."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.idempotency.service import fingerprint
from tests.conftest import Committed
from tests.factories import (
    POLICY_TEXT,
    Keys,
    claim,
    policy_chunks,
    record_run,
    register_version,
    results_for,
)

PROBLEM_JSON = "application/problem+json"
REPLAYED = "idempotent-replayed"
# Every table a write of the five routes adds rows to.
WRITTEN = (
    "document_versions",
    "chunks",
    "runs",
    "citations",
    "verifications",
    "erasures",
    "memory_records",
    "audit_entries",
)


async def rows(connection: AsyncConnection, tenant: str = "acme") -> dict[str, int]:
    """How many rows of `tenant` each written table holds."""
    await connection.execute(text("SELECT set_config('app.tenant', :t, true)"), {"t": tenant})
    counts = {}
    for table in WRITTEN:
        found = await connection.execute(text(f"SELECT count(*) FROM {table}"))
        counts[table] = found.scalar_one()
    return counts


async def post(
    client: httpx.AsyncClient,
    keys: Keys,
    path: str,
    body: dict[str, Any],
    *,
    key: str | None = "key-1",
    scope: str = "agent",
    tenant: str = "acme",
) -> httpx.Response:
    headers = keys.headers(scope, tenant=tenant)
    if key is not None:
        headers["Idempotency-Key"] = key
    return await client.post(path, json=body, headers=headers)


def run_body() -> dict[str, Any]:
    return {"query": "refunds?", "scope": "HANDBOOK", "results": results_for(policy_chunks())}


def version_body(version: str = "2026-11-03") -> dict[str, Any]:
    return {"version": version, "text": POLICY_TEXT, "chunks": policy_chunks()}


async def a_run(client: httpx.AsyncClient, keys: Keys) -> dict[str, Any]:
    await register_version(client, keys)
    return await record_run(client, keys)


def grounded(run: dict[str, Any]) -> dict[str, Any]:
    cited = run["citations"][0]["citation_id"]
    return {"claims": [claim("Refunds take 30 days.", cited)], "citations": run["citations"]}


def ungrounded(run: dict[str, Any]) -> dict[str, Any]:
    return {"claims": [claim("Refunds take 30 days.", "cit_invented")], "citations": []}


async def write_of_each_route(
    client: httpx.AsyncClient, keys: Keys
) -> list[tuple[str, dict[str, Any], str]]:
    """A path, a body and the key scope for each idempotent route, over a registered run."""
    run = await a_run(client, keys)
    await register_version(client, keys, document_id="to-erase")
    cited = [c["citation_id"] for c in run["citations"]]
    return [
        ("/v1/documents/other/versions", version_body(), "ingest"),
        ("/v1/runs", run_body(), "agent"),
        (f"/v1/runs/{run['run_id']}/answers", grounded(run), "agent"),
        (f"/v1/runs/{run['run_id']}/answers", ungrounded(run), "agent"),
        ("/v1/documents/to-erase/erase", {"reason": "request", "request_ref": "DSR-1"}, "ingest"),
        ("/v1/memory", {"text": "Refunds take 30 days.", "citation_ids": cited[:2]}, "agent"),
    ]


async def test_a_retry_with_the_key_replays_the_first_response_and_writes_nothing(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    for i, (path, body, scope) in enumerate(await write_of_each_route(client, keys)):
        key = f"retry-{i}"
        first = await post(client, keys, path, body, key=key, scope=scope)
        assert first.status_code in (200, 201, 422), first.text
        before = await rows(connection)
        again = await post(client, keys, path, body, key=key, scope=scope)
        assert (again.status_code, again.content) == (first.status_code, first.content), path
        assert again.headers["content-type"] == first.headers["content-type"]
        assert again.headers[REPLAYED] == "true"
        assert REPLAYED not in first.headers
        assert await rows(connection) == before, path


async def test_a_replayed_rejection_names_the_one_recorded_verification(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await a_run(client, keys)
    path = f"/v1/runs/{run['run_id']}/answers"
    first = await post(client, keys, path, ungrounded(run))
    again = await post(client, keys, path, ungrounded(run))
    assert first.status_code == again.status_code == 422
    assert first.headers["content-type"] == PROBLEM_JSON
    assert again.json()["verification_id"] == first.json()["verification_id"]
    assert (await rows(connection))["verifications"] == 1


async def test_without_a_key_each_request_writes_again(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)
    first = await post(client, keys, "/v1/runs", run_body(), key=None)
    second = await post(client, keys, "/v1/runs", run_body(), key=None)
    assert first.json()["run_id"] != second.json()["run_id"]
    assert (await rows(connection))["runs"] == 2


async def test_the_key_with_another_body_or_route_is_a_mismatch_that_writes_nothing(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await a_run(client, keys)
    first = await post(client, keys, "/v1/runs", run_body(), key="used")
    assert first.status_code == 201
    before = await rows(connection)
    other_body = run_body() | {"query": "exchanges?"}
    for path, body in (
        ("/v1/runs", other_body),
        (f"/v1/runs/{run['run_id']}/answers", grounded(run)),
    ):
        refused = await post(client, keys, path, body, key="used")
        assert refused.status_code == 422, refused.text
        assert refused.headers["content-type"] == PROBLEM_JSON
        problem = refused.json()
        assert problem["code"] == "idempotency_mismatch"
        assert "exchanges" not in problem["detail"]
    assert await rows(connection) == before


async def test_the_same_body_in_another_key_order_is_the_same_request(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)
    body = run_body()
    first = await post(client, keys, "/v1/runs", body)
    again = await post(client, keys, "/v1/runs", dict(reversed(body.items())))
    assert again.json()["run_id"] == first.json()["run_id"]
    assert (await rows(connection))["runs"] == 1


async def test_keys_are_per_tenant(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    for tenant in ("acme", "globex"):
        await register_version(client, keys, tenant=tenant)
    acme = await post(client, keys, "/v1/runs", run_body(), key="shared")
    globex = await post(client, keys, "/v1/runs", run_body(), key="shared", tenant="globex")
    assert acme.status_code == globex.status_code == 201
    assert globex.json()["tenant"] == "globex"
    assert REPLAYED not in globex.headers
    assert (await rows(connection, "globex"))["runs"] == 1
    assert (await rows(connection, "acme"))["runs"] == 1


async def test_a_replayed_registration_keeps_its_status(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    path = "/v1/documents/refund-policy/versions"
    created = await post(client, keys, path, version_body(), key="reg-1", scope="ingest")
    same = await post(client, keys, path, version_body(), key="reg-2", scope="ingest")
    assert (created.status_code, same.status_code) == (201, 200)
    for key, status in (("reg-1", 201), ("reg-2", 200)):
        replayed = await post(client, keys, path, version_body(), key=key, scope="ingest")
        assert (replayed.status_code, replayed.headers[REPLAYED]) == (status, "true")


async def test_a_failure_that_wrote_nothing_keeps_nothing(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    missing = await post(client, keys, "/v1/runs", run_body(), key="early")
    assert missing.status_code == 422  # the registry does not hold the version yet
    assert missing.json()["code"] == "configuration_error"
    await register_version(client, keys)
    retried = await post(client, keys, "/v1/runs", run_body(), key="early")
    assert retried.status_code == 201
    assert REPLAYED not in retried.headers
    assert (await rows(connection))["runs"] == 1


async def test_an_erasure_forgets_the_kept_responses_that_name_its_document(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    await register_version(client, keys, document_id="keeper")
    kept = {
        "acme": run_body(),
        "keeper": {"results": results_for(policy_chunks(), document_id="keeper")},
    }
    for name, body in kept.items():
        assert (await post(client, keys, "/v1/runs", body, key=name)).status_code == 201

    def erase() -> Awaitable[httpx.Response]:
        body = {"reason": "request", "request_ref": "DSR-9"}
        path = "/v1/documents/refund-policy/erase"
        return post(client, keys, path, body, key="erasure", scope="ingest")

    erased = await erase()
    assert erased.status_code == 200

    retried = await post(client, keys, "/v1/runs", kept["acme"], key="acme")
    assert REPLAYED not in retried.headers
    assert retried.status_code == 422  # done again: the version it cites is erased now
    assert retried.json()["errors"][0]["problem"] == "erased_version"
    unrelated = await post(client, keys, "/v1/runs", kept["keeper"], key="keeper")
    assert (unrelated.status_code, unrelated.headers.get(REPLAYED)) == (201, "true")
    again = await erase()
    assert (again.content, again.headers.get(REPLAYED)) == (erased.content, "true")


async def expire_keys(connection: AsyncConnection, tenant: str = "acme") -> None:
    await connection.execute(text("SELECT set_config('app.tenant', :t, true)"), {"t": tenant})
    await connection.execute(
        text("UPDATE idempotency_keys SET created_at = created_at - interval '2 days'")
    )


async def test_an_expired_key_is_a_new_key_and_expired_keys_are_purged(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)
    first = await post(client, keys, "/v1/runs", run_body(), key="old")
    for i in range(3):
        await post(client, keys, "/v1/runs", run_body(), key=f"stale-{i}")
    await expire_keys(connection)
    again = await post(client, keys, "/v1/runs", run_body() | {"query": "other"}, key="old")
    assert again.status_code == 201
    assert again.json()["run_id"] != first.json()["run_id"]
    kept = await connection.execute(text("SELECT key FROM idempotency_keys ORDER BY key"))
    assert kept.scalars().all() == ["old"]


@pytest.mark.parametrize("key", [b"", b"x" * 256, b"tab\there", "caf\u00e9".encode("latin-1")])
async def test_a_malformed_key_is_a_validation_error(
    client: httpx.AsyncClient, keys: Keys, key: bytes
) -> None:
    await register_version(client, keys)
    headers = {name.encode(): value.encode() for name, value in keys.headers("agent").items()}
    headers[b"Idempotency-Key"] = key
    response = await client.post("/v1/runs", json=run_body(), headers=headers)
    assert response.status_code == 422
    problem = response.json()
    assert problem["code"] == "validation_error"
    assert problem["errors"][0]["loc"] == ["header", "Idempotency-Key"]


async def test_a_key_beside_an_invalid_header_is_a_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    headers = keys.headers("agent") | {"Idempotency-Key": "k", "X-Grounding-Tenant": "x" * 129}
    response = await client.post("/v1/runs", json=run_body(), headers=headers)
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


def test_the_fingerprint_binds_method_path_and_body_not_key_order() -> None:
    body = {"a": 1, "b": ["x", {"c": "\ud800"}]}
    same = fingerprint("POST", "/v1/runs", dict(reversed(body.items())))
    assert fingerprint("POST", "/v1/runs", body) == same
    assert fingerprint("POST", "/v1/memory", body) != same
    assert fingerprint("PUT", "/v1/runs", body) != same
    assert fingerprint("POST", "/v1/runs", body | {"a": 2}) != same


async def test_concurrent_requests_with_one_key_write_once(committed: Committed) -> None:
    client, keys = committed.client, committed.keys
    await register_version(client, keys)
    answers = await asyncio.gather(
        *(post(client, keys, "/v1/runs", run_body(), key="raced") for _ in range(8))
    )
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["run_id"] for a in answers}) == 1
    assert sum(REPLAYED in a.headers for a in answers) == 7
    async with committed.owner.connect() as owner:
        runs = await owner.execute(text("SELECT count(*) FROM runs"))
        assert runs.scalar_one() == 1
