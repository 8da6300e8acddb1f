"""Memory records over HTTP: provenance kept, ungrounded ids refused, citations resolved on read."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.factories import (
    POLICY_TEXT,
    Keys,
    claim,
    policy_chunks,
    record_run,
    register_version,
    submit_answer,
)

PROBLEM = "application/problem+json"


async def policy_run(client: httpx.AsyncClient, keys: Keys, *, tenant: str = "acme") -> Any:
    await register_version(client, keys, tenant=tenant)
    return await record_run(client, keys, tenant=tenant)


def ids(run: dict[str, Any]) -> list[str]:
    return [c["citation_id"] for c in run["citations"]]


async def remember(
    client: httpx.AsyncClient, keys: Keys, body: dict[str, Any], *, expect: int = 201
) -> dict[str, Any]:
    response = await client.post("/v1/memory", json=body, headers=keys.headers("agent"))
    assert response.status_code == expect, response.text
    if expect != 201:
        assert response.headers["content-type"] == PROBLEM
    found: dict[str, Any] = response.json()
    return found


async def memory_count(connection: AsyncConnection) -> int:
    count = await connection.scalar(text("SELECT count(*) FROM memory_records"))
    assert isinstance(count, int)
    return count


def without_detail(violations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in violation.items() if k != "detail"} for violation in violations]


def chunk_text(chunk_id: str) -> str:
    [chunk] = [c for c in policy_chunks() if c["chunk_id"] == chunk_id]
    return POLICY_TEXT[chunk["start"] : chunk["end"]]


async def test_memory_from_citation_ids_keeps_them_in_order_once(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, _ = ids(run)
    body = await remember(
        client, keys, {"text": "Refunds take 30 days 🧾.", "citation_ids": [c2, c0, c2, c1]}
    )
    assert body["memory_id"].startswith("mem_")
    assert body["text"] == "Refunds take 30 days 🧾."
    assert body["citation_ids"] == [c2, c0, c1]
    assert body["verification_id"] is None
    assert isinstance(body["created_at"], str)
    row = (
        await connection.execute(
            text("SELECT tenant, citation_ids FROM memory_records WHERE memory_id = :m"),
            {"m": body["memory_id"]},
        )
    ).one()
    assert (row.tenant, row.citation_ids) == ("acme", [c2, c0, c1])


async def test_memory_from_a_grounded_verification_takes_its_provenance(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, _ = ids(run)
    passed = await submit_answer(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", c2, c0), claim("B.", c0, c1)],
        citations=run["citations"],
    )
    body = await remember(
        client, keys, {"text": "A summary.", "verification_id": passed["verification_id"]}
    )
    assert body["citation_ids"] == [c2, c0, c1] == passed["provenance"]
    assert body["verification_id"] == passed["verification_id"]


@pytest.mark.parametrize("kind", ["rejected", "refused"])
async def test_memory_from_a_verification_that_did_not_ground_is_refused(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection, kind: str
) -> None:
    run = await policy_run(client, keys)
    if kind == "refused":
        source = await submit_answer(
            client, keys, run["run_id"], claims=[], citations=[], refusal=True
        )
    else:
        source = await submit_answer(
            client,
            keys,
            run["run_id"],
            claims=[claim("A.", ids(run)[0]), claim("B.")],
            citations=run["citations"],
            expect=422,
        )
    body = await remember(
        client,
        keys,
        {"text": "A summary.", "verification_id": source["verification_id"]},
        expect=422,
    )
    assert body["code"] == "ungrounded_citation"
    assert [v["class"] for v in body["violations"]] == ["ungrounded_citation"]
    assert "verification_id" not in body
    assert await memory_count(connection) == 0


async def test_memory_from_an_unknown_or_another_tenants_verification_is_the_same_404(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    theirs = await policy_run(client, keys, tenant="globex")
    passed = await submit_answer(
        client,
        keys,
        theirs["run_id"],
        claims=[claim("A.", ids(theirs)[0])],
        citations=theirs["citations"],
        tenant="globex",
    )
    foreign = await remember(
        client, keys, {"text": "X.", "verification_id": passed["verification_id"]}, expect=404
    )
    unknown = await remember(
        client, keys, {"text": "X.", "verification_id": "ver_does_not_exist"}, expect=404
    )
    assert foreign == unknown
    assert foreign["code"] == "not_found"
    assert await memory_count(connection) == 0


async def test_memory_naming_unknown_citation_ids_is_ungrounded_with_missing(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    c0, c1, _, _ = ids(run)
    body = await remember(
        client,
        keys,
        {"text": "X.", "citation_ids": [c0, "cit_invented", c1, "cit_other"]},
        expect=422,
    )
    assert body["code"] == "ungrounded_citation"
    assert without_detail(body["violations"]) == [
        {
            "class": "ungrounded_citation",
            "missing": ["cit_invented", "cit_other"],
            "available": [c0, c1],
        }
    ]
    assert await memory_count(connection) == 0


async def test_memory_naming_another_tenants_citations_is_ungrounded_like_unknown_ones(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    theirs = await policy_run(client, keys, tenant="globex")
    foreign = ids(theirs)[0]
    body = await remember(
        client, keys, {"text": "X.", "citation_ids": [ids(run)[0], foreign]}, expect=422
    )
    assert body["code"] == "ungrounded_citation"
    assert without_detail(body["violations"]) == [
        {"class": "ungrounded_citation", "missing": [foreign], "available": [ids(run)[0]]}
    ]
    assert await memory_count(connection) == 0


async def test_memory_resting_on_no_citation_is_uncited(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    body = await remember(client, keys, {"text": "X.", "citation_ids": []}, expect=422)
    assert body["code"] == "uncited_claim"
    assert [v["class"] for v in body["violations"]] == ["uncited_claim"]
    assert await memory_count(connection) == 0


@pytest.mark.parametrize(
    "body",
    [
        {"text": "X."},
        {"text": "X.", "citation_ids": ["cit_a"], "verification_id": "ver_a"},
        {"text": "", "citation_ids": ["cit_a"]},
        {"text": "X.", "citation_ids": ["cit_a"], "sources": []},
    ],
)
async def test_memory_body_must_name_exactly_one_source(
    client: httpx.AsyncClient, keys: Keys, body: dict[str, Any]
) -> None:
    problem = await remember(client, keys, body, expect=422)
    assert problem["code"] == "validation_error"


async def test_reading_memory_resolves_each_citation_to_its_excerpt(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, _ = ids(run)
    by_id = {c["citation_id"]: c for c in run["citations"]}
    created = await remember(client, keys, {"text": "Summary.", "citation_ids": [c2, c0, c1]})
    response = await client.get(
        f"/v1/memory/{created['memory_id']}", headers=keys.headers("support")
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert {k: body[k] for k in ("memory_id", "text", "citation_ids", "created_at")} == {
        k: created[k] for k in ("memory_id", "text", "citation_ids", "created_at")
    }
    assert [entry["citation_id"] for entry in body["citations"]] == [c2, c0, c1]
    for entry in body["citations"]:
        cited = by_id[entry["citation_id"]]
        assert entry == {
            "status": "excerpt",
            "citation_id": cited["citation_id"],
            "document_id": "refund-policy",
            "document_version": "2026-11-03",
            "span": cited["span"],
            "text": chunk_text(cited["chunk_id"]),
            "erased": False,
            "superseded_by": None,
            "locator": cited["locator"],
        }


async def test_reading_memory_over_an_erased_version_shows_tombstones(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    c0, c1, _, _ = ids(run)
    created = await remember(client, keys, {"text": "Summary.", "citation_ids": [c1, c0]})
    erased = await client.post(
        "/v1/documents/refund-policy/erase",
        json={"reason": "right-to-erasure request", "request_ref": "DSR-7"},
        headers=keys.headers("ingest"),
    )
    assert erased.status_code == 200, erased.text
    response = await client.get(f"/v1/memory/{created['memory_id']}", headers=keys.headers("agent"))
    assert response.status_code == 200, response.text
    entries = response.json()["citations"]
    assert [(e["citation_id"], e["status"], e["erased"], e["text"]) for e in entries] == [
        (c1, "tombstone", True, None),
        (c0, "tombstone", True, None),
    ]
    assert {e["request_ref"] for e in entries} == {"DSR-7"}
    assert all(chunk_text("c1") not in str(e) for e in entries)


async def test_memory_of_another_tenant_is_the_same_404_as_unknown(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    created = await remember(client, keys, {"text": "Summary.", "citation_ids": ids(run)[:1]})
    theirs = await client.get(
        f"/v1/memory/{created['memory_id']}", headers=keys.headers("support", tenant="globex")
    )
    unknown = await client.get("/v1/memory/mem_does_not_exist", headers=keys.headers("support"))
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json() == unknown.json()
    assert theirs.json()["code"] == "not_found"


async def test_memory_writes_need_the_agent_scope(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post(
        "/v1/memory",
        json={"text": "X.", "citation_ids": ["cit_a"]},
        headers=keys.headers("support"),
    )
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
