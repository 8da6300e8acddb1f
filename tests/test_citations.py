"""Citations read back: exact excerpts of the pinned version, tombstones, batch resolution."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from datetime import UTC
from typing import Any

import asyncpg
import httpx
import pydantic_core
import pytest
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from app import db
from app.access import service as access
from app.access.auth import READERS
from app.access.service import Reader
from app.bodies import json_response
from app.citations import service as citations
from app.citations.schemas import ResolveRead
from app.config import Settings
from app.grounding.models import Excerpt, Tombstone
from app.main import create_app
from tests.conftest import Committed, plan_nodes, serving, statements_sent
from tests.factories import (
    POLICY_TEXT,
    Keys,
    erase_document,
    policy_chunks,
    record_run,
    register_version,
    results_for,
)

DOC = "refund-policy"
V1 = "2026-11-03"


def _utf8(text_: str, offset: int) -> int:
    return len(text_[:offset].encode("utf-8"))


def _utf16(text_: str, offset: int) -> int:
    return len(text_[:offset].encode("utf-16-le")) // 2


def _sha256(text_: str) -> str:
    return hashlib.sha256(text_.encode("utf-8")).hexdigest()


async def _cite(
    client: httpx.AsyncClient,
    keys: Keys,
    chunks: list[dict[str, Any]],
    *,
    tenant: str = "acme",
    document_id: str = DOC,
    version: str = V1,
) -> list[dict[str, Any]]:
    run = await record_run(
        client,
        keys,
        tenant=tenant,
        results=results_for(chunks, document_id=document_id, version=version),
    )
    citations: list[dict[str, Any]] = run["citations"]
    return citations


async def _excerpt(
    client: httpx.AsyncClient, keys: Keys, citation_id: str, *, tenant: str = "acme"
) -> httpx.Response:
    return await client.get(
        f"/v1/citations/{citation_id}/excerpt", headers=keys.headers("support", tenant=tenant)
    )


async def _resolve(
    client: httpx.AsyncClient, keys: Keys, ids: list[str], *, tenant: str = "acme"
) -> list[dict[str, Any]]:
    response = await client.post(
        "/v1/citations/resolve",
        json={"citation_ids": ids},
        headers=keys.headers("support", tenant=tenant),
    )
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def _tricky_chunks(text_: str) -> list[dict[str, Any]]:
    """Every single code point and every three-code-point window of the emoji, combining-mark
    and CJK region, plus named chunks on the sequences themselves and the text's two ends."""
    region_start = text_.index("Famille")
    region_end = text_.index("Exchanges")
    family = text_.index("👨\u200d👩\u200d👧")
    cafe = text_.index("cafe\u0301")
    cjk = text_.index("返金")
    bounds = {
        "family": (family, family + 5),
        "man-before-zwj": (family, family + 1),
        "lone-zwj": (family + 1, family + 2),
        "cafe": (cafe, cafe + 5),
        "lone-mark": (cafe + 4, cafe + 5),
        "cjk-sentence": (cjk, text_.index("。") + 1),
        "first": (0, 1),
        "receipt-to-end": (text_.index("🧾"), len(text_)),
        "whole": (0, len(text_)),
    }
    for offset in range(region_start, region_end):
        bounds[f"p{offset}"] = (offset, offset + 1)
        bounds[f"w{offset}"] = (offset, offset + 3)
    return [{"chunk_id": cid, "start": s, "end": e} for cid, (s, e) in bounds.items()]


async def _integrity_errors(client: httpx.AsyncClient) -> float:
    exposition = (await client.get("/metrics")).text
    found = re.search(r"^grounding_integrity_errors_total (\S+)$", exposition, re.MULTILINE)
    assert found is not None, "the integrity error counter is not exposed"
    return float(found.group(1))


# --- exact characters -------------------------------------------------------------------------


async def test_excerpt_is_exactly_the_registered_code_points_across_emoji_marks_and_cjk(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = _tricky_chunks(POLICY_TEXT)
    await register_version(client, keys, chunks=chunks)
    citations = await _cite(client, keys, chunks)
    assert len(citations) == len(chunks)

    for chunk, citation in zip(chunks, citations, strict=True):
        start, end = chunk["start"], chunk["end"]
        response = await _excerpt(client, keys, citation["citation_id"])
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["text"] == POLICY_TEXT[start:end], chunk["chunk_id"]
        assert body["span"] == {"start": start, "end": end}
        assert body["erased"] is False
        assert body["superseded_by"] is None
        assert body["document_id"] == DOC
        assert body["document_version"] == V1
        assert body["citation_id"] == citation["citation_id"]
        assert body["locator"] == citation["locator"]
        # What the citation pins agrees with the same characters in the other encodings.
        assert citation["span_sha256"] == _sha256(POLICY_TEXT[start:end])
        assert citation["span_utf8"] == {
            "start": _utf8(POLICY_TEXT, start),
            "end": _utf8(POLICY_TEXT, end),
        }
        assert citation["span_utf16"] == {
            "start": _utf16(POLICY_TEXT, start),
            "end": _utf16(POLICY_TEXT, end),
        }


async def test_resolve_gives_the_same_exact_characters_as_excerpt(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = _tricky_chunks(POLICY_TEXT)
    await register_version(client, keys, chunks=chunks)
    citations = await _cite(client, keys, chunks)

    results = await _resolve(client, keys, [c["citation_id"] for c in citations])

    assert [r["citation_id"] for r in results] == [c["citation_id"] for c in citations]
    for chunk, result in zip(chunks, results, strict=True):
        assert result["status"] == "excerpt"
        assert result["text"] == POLICY_TEXT[chunk["start"] : chunk["end"]], chunk["chunk_id"]


async def test_excerpt_locator_carries_the_chunk_page_section_and_uri(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = policy_chunks()
    chunks[0]["uri"] = "https://handbook/refunds#scope"
    await register_version(client, keys, chunks=chunks)
    citations = await _cite(client, keys, chunks)

    first = (await _excerpt(client, keys, citations[0]["citation_id"])).json()
    second = (await _excerpt(client, keys, citations[1]["citation_id"])).json()

    assert first["locator"] == {"uri": "https://handbook/refunds#scope", "page": 1, "section": "S1"}
    # A chunk without its own uri is located by its version's.
    assert second["locator"] == {"uri": "https://handbook/refunds", "page": 2, "section": "S2"}


# --- superseded versions ----------------------------------------------------------------------


async def test_excerpt_of_a_superseded_version_shows_the_pinned_text_and_the_newer_version(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    newer_text = POLICY_TEXT.replace("30 days", "14 days")
    await register_version(client, keys, version="v1")
    [old, *_] = await _cite(client, keys, policy_chunks(), version="v1")
    await register_version(client, keys, version="v2", text=newer_text)
    [new, *_] = await _cite(client, keys, policy_chunks(newer_text), version="v2")

    pinned = (await _excerpt(client, keys, old["citation_id"])).json()
    current = (await _excerpt(client, keys, new["citation_id"])).json()

    assert pinned["text"] == POLICY_TEXT[old["span"]["start"] : old["span"]["end"]]
    assert "30 days" in pinned["text"]
    assert pinned["document_version"] == "v1"
    assert pinned["superseded_by"] == "v2"
    assert "14 days" in current["text"]
    assert current["superseded_by"] is None


async def test_superseded_by_is_the_newest_registered_not_the_greatest_name(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="zulu")
    [cited, *_] = await _cite(client, keys, policy_chunks(), version="zulu")
    await register_version(client, keys, version="alpha")
    await register_version(client, keys, version="mike")

    body = (await _excerpt(client, keys, cited["citation_id"])).json()
    assert body["superseded_by"] == "mike"

    [alpha, *_] = await _cite(client, keys, policy_chunks(), version="alpha")
    assert (await _excerpt(client, keys, alpha["citation_id"])).json()["superseded_by"] == "mike"


async def test_superseded_by_falls_back_past_erased_versions(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    for version in ("v1", "v2", "v3"):
        await register_version(client, keys, version=version)
    [v1] = await _cite(client, keys, policy_chunks()[:1], version="v1")
    [v2] = await _cite(client, keys, policy_chunks()[:1], version="v2")

    assert (await _excerpt(client, keys, v1["citation_id"])).json()["superseded_by"] == "v3"

    await erase_document(client, keys, versions=["v3"])
    after_v3 = (await _excerpt(client, keys, v1["citation_id"])).json()
    assert after_v3["superseded_by"] == "v2"
    assert after_v3["text"] == POLICY_TEXT[v1["span"]["start"] : v1["span"]["end"]]
    assert (await _excerpt(client, keys, v2["citation_id"])).json()["superseded_by"] is None

    await erase_document(client, keys, versions=["v2"], request_ref="DSR-0002")
    assert (await _excerpt(client, keys, v1["citation_id"])).json()["superseded_by"] is None


async def test_superseded_by_ignores_other_documents_and_other_tenants(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    [cited] = await _cite(client, keys, policy_chunks()[:1], version="v1")
    await register_version(client, keys, document_id="other-doc", version="v2")
    await register_version(client, keys, tenant="globex", version="v2")

    assert (await _excerpt(client, keys, cited["citation_id"])).json()["superseded_by"] is None


# --- batch resolution -------------------------------------------------------------------------


async def test_resolve_answers_every_id_in_order_live_erased_missing_foreign_and_repeated(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    live = await _cite(client, keys, policy_chunks())
    await register_version(client, keys, document_id="gone", version="g1")
    [erased] = await _cite(client, keys, policy_chunks()[:1], document_id="gone", version="g1")
    erasure = await erase_document(client, keys, document_id="gone", request_ref="DSR-77")
    await register_version(client, keys, tenant="globex")
    [foreign] = await _cite(client, keys, policy_chunks()[:1], tenant="globex")

    asked = [
        live[2]["citation_id"],
        erased["citation_id"],
        "cit_does_not_exist",
        foreign["citation_id"],
        live[0]["citation_id"],
        live[2]["citation_id"],
        erased["citation_id"],
    ]
    results = await _resolve(client, keys, asked)

    assert [r["citation_id"] for r in results] == asked
    assert [r["status"] for r in results] == [
        "excerpt",
        "tombstone",
        "not_found",
        "not_found",
        "excerpt",
        "excerpt",
        "tombstone",
    ]
    span = live[2]["span"]
    assert results[0]["text"] == POLICY_TEXT[span["start"] : span["end"]]
    assert results[5] == results[0]
    assert results[4]["text"] == POLICY_TEXT[live[0]["span"]["start"] : live[0]["span"]["end"]]
    tombstone = results[1]
    assert tombstone["erased"] is True
    assert tombstone["text"] is None
    assert tombstone["request_ref"] == "DSR-77"
    assert tombstone["erased_at"] == erasure["erased_at"]
    assert tombstone["span"] == erased["span"]
    assert tombstone["document_id"] == "gone"
    assert tombstone["document_version"] == "g1"
    assert "span_sha256" not in tombstone
    assert results[6] == tombstone
    # A foreign id is answered exactly as a nonexistent one: nothing but the id and the status.
    assert results[2] == {"citation_id": "cit_does_not_exist", "status": "not_found"}
    assert results[3] == {"citation_id": foreign["citation_id"], "status": "not_found"}


async def test_resolve_of_nothing_is_an_empty_list(client: httpx.AsyncClient, keys: Keys) -> None:
    assert await _resolve(client, keys, []) == []


async def test_resolve_is_one_statement_whatever_the_batch_size(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    chunks = _tricky_chunks(POLICY_TEXT)
    await register_version(client, keys, chunks=chunks)
    citations = await _cite(client, keys, chunks)
    ids = [c["citation_id"] for c in citations]

    async with statements_sent(connection) as one:
        await _resolve(client, keys, ids[:1])
    async with statements_sent(connection) as many:
        await _resolve(client, keys, [*ids, "cit_missing", *ids[:10]])

    assert len(many) == len(one)
    assert sum("FROM citations" in s for s in many) == 1


async def test_resolve_limit_is_a_setting_and_defaults_to_a_thousand(
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    client: httpx.AsyncClient,
    keys: Keys,
) -> None:
    assert Settings().max_resolve_ids == 1000
    headers = keys.headers("support")
    at_default = await client.post(
        "/v1/citations/resolve", json={"citation_ids": ["cit_x"] * 1000}, headers=headers
    )
    over_default = await client.post(
        "/v1/citations/resolve", json={"citation_ids": ["cit_x"] * 1001}, headers=headers
    )
    assert at_default.status_code == 200
    assert over_default.status_code == 413
    assert over_default.json()["code"] == "payload_too_large"

    small: FastAPI = create_app(settings.model_copy(update={"max_resolve_ids": 3}))
    small.state.sessionmaker = sessionmaker
    transport = httpx.ASGITransport(app=small)
    async with httpx.AsyncClient(transport=transport, base_url="http://grounding.test") as other:
        ok = await other.post(
            "/v1/citations/resolve", json={"citation_ids": ["a", "b", "c"]}, headers=headers
        )
        over = await other.post(
            "/v1/citations/resolve", json={"citation_ids": ["a", "b", "c", "d"]}, headers=headers
        )
    assert ok.status_code == 200
    assert over.status_code == 413
    assert over.json()["limit"] == 3


# --- integrity --------------------------------------------------------------------------------

FORGERIES = {
    "same-length text": "UPDATE chunks SET text = repeat('X', span_end - span_start)",
    "shorter text": "UPDATE chunks SET text = left(text, -1)",
    "one changed code point": "UPDATE chunks SET text = 'r' || substr(text, 2)",
    "missing text": "UPDATE chunks SET text = NULL",
    "hash of other text": "UPDATE citations SET span_sha256 = repeat('0', 64)",
    "hash erased but text kept": "UPDATE citations SET span_sha256 = NULL",
}


@pytest.mark.parametrize("forgery", FORGERIES.values(), ids=FORGERIES.keys())
async def test_forged_stored_text_is_an_integrity_error_that_shows_no_text(
    forgery: str,
    client: httpx.AsyncClient,
    keys: Keys,
    connection: AsyncConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    chunks = policy_chunks()
    await register_version(client, keys, chunks=chunks)
    citations = await _cite(client, keys, chunks)
    target, intact = citations[0], citations[1]
    original = POLICY_TEXT[target["span"]["start"] : target["span"]["end"]]
    table = "citations" if "citations" in forgery else "chunks"
    key_column = "citation_id" if table == "citations" else "chunk_id"
    key = target["citation_id"] if table == "citations" else target["chunk_id"]
    await connection.execute(text("SELECT set_config('app.tenant', 'acme', true)"))
    forged = await connection.execute(
        text(f"{forgery} WHERE tenant = 'acme' AND {key_column} = :key"), {"key": key}
    )
    assert forged.rowcount == 1
    before = await _integrity_errors(client)

    with caplog.at_level(logging.DEBUG):
        excerpt = await _excerpt(client, keys, target["citation_id"])
        resolved = await client.post(
            "/v1/citations/resolve",
            json={"citation_ids": [intact["citation_id"], target["citation_id"]]},
            headers=keys.headers("support"),
        )

    for response in (excerpt, resolved):
        assert response.status_code == 500
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["code"] == "integrity_error"
        assert "XXXX" not in response.text
        assert original[:12] not in response.text
        assert "text" not in response.json()
    assert await _integrity_errors(client) == before + 2
    logged = [(r.getMessage(), repr(r.__dict__)) for r in caplog.records]
    assert any(target["citation_id"] in detail for _, detail in logged)
    for message, detail in logged:
        for forbidden in (original[:12], "XXXX"):
            assert forbidden not in message
            assert forbidden not in detail
    # The other citations are untouched and still excerpt.
    still = await _excerpt(client, keys, intact["citation_id"])
    assert still.status_code == 200
    assert still.json()["text"] == POLICY_TEXT[intact["span"]["start"] : intact["span"]["end"]]


# --- tenants and scopes -----------------------------------------------------------------------


async def test_excerpt_reads_its_own_tenants_text_when_another_tenant_reuses_every_name(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    globex_text = "Globex never refunds anything at all, whatever the receipt says."
    chunks = [{"chunk_id": "c1", "start": 0, "end": 20}]
    await register_version(client, keys, chunks=chunks)
    await register_version(client, keys, tenant="globex", text=globex_text, chunks=chunks)
    [acme] = await _cite(client, keys, chunks)
    [globex] = await _cite(client, keys, chunks, tenant="globex")

    assert (await _excerpt(client, keys, acme["citation_id"])).json()["text"] == POLICY_TEXT[:20]
    globex_excerpt = await _excerpt(client, keys, globex["citation_id"], tenant="globex")
    assert globex_excerpt.json()["text"] == globex_text[:20]


async def test_another_tenants_citation_is_absent_from_every_citation_endpoint(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    foreign = keys.headers("support", tenant="globex")

    for path in ("/v1/citations/{}", "/v1/citations/{}/excerpt"):
        theirs = await client.get(path.format(cited["citation_id"]), headers=foreign)
        nobodys = await client.get(path.format("cit_nobody_has_this"), headers=foreign)
        assert theirs.status_code == nobodys.status_code == 404
        assert theirs.json() == nobodys.json()
        assert POLICY_TEXT[:12] not in theirs.text
    results = await _resolve(client, keys, [cited["citation_id"]], tenant="globex")
    assert results == [{"citation_id": cited["citation_id"], "status": "not_found"}]
    mine = await client.get(f"/v1/citations/{cited['citation_id']}", headers=keys.headers("agent"))
    assert mine.status_code == 200


@pytest.mark.parametrize(
    ("scope", "status"),
    [("agent", 200), ("support", 200), ("admin", 200), ("ingest", 403), ("audit", 403)],
)
async def test_citation_reads_need_a_reader_scope(
    scope: str, status: int, client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    headers = keys.headers(scope)
    cid = cited["citation_id"]

    responses = [
        await client.get(f"/v1/citations/{cid}", headers=headers),
        await client.get(f"/v1/citations/{cid}/excerpt", headers=headers),
        await client.post("/v1/citations/resolve", json={"citation_ids": [cid]}, headers=headers),
    ]
    assert [r.status_code for r in responses] == [status] * 3


async def test_citation_reads_without_a_key_are_unauthorized(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    cid = cited["citation_id"]
    bad = {"Authorization": "Bearer gsk_key_0000_nope"}

    for headers in ({}, bad):
        responses = [
            await client.get(f"/v1/citations/{cid}", headers=headers),
            await client.get(f"/v1/citations/{cid}/excerpt", headers=headers),
            await client.post(
                "/v1/citations/resolve", json={"citation_ids": [cid]}, headers=headers
            ),
        ]
        assert [r.status_code for r in responses] == [401] * 3
        assert all(r.json()["code"] == "unauthorized" for r in responses)


# --- reads that open their key in their own statement -----------------------------------------


async def _create_key(
    client: httpx.AsyncClient, keys: Keys, *, scopes: list[str]
) -> dict[str, Any]:
    response = await client.post(
        "/v1/admin/keys", json={"tenant": "acme", "scopes": scopes}, headers=keys.headers("admin")
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


# How the test's sessions join its transaction; a read's session ends without committing.
SAVEPOINTS = ("SAVEPOINT", "RELEASE", "ROLLBACK TO SAVEPOINT")


def _reads(cid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("GET", f"/v1/citations/{cid}/excerpt", None),
        ("POST", "/v1/citations/resolve", {"citation_ids": [cid]}),
    ]


async def test_an_excerpt_or_resolve_is_one_statement_that_opens_the_key(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())

    for method, path, body in _reads(cited["citation_id"]):
        async with statements_sent(connection) as seen:
            response = await client.request(
                method, path, json=body, headers=keys.headers("support")
            )
        assert response.status_code == 200, response.text
        # The test's sessions join its transaction as savepoints; nothing else is sent.
        [statement] = [s for s in seen if not s.startswith(SAVEPOINTS)]
        assert "FROM api_keys" in statement
        assert "FROM citations" in statement


async def test_a_keyed_read_has_no_transaction_of_its_own_around_its_statement(
    committed: Committed, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, keys = committed.client, committed.keys
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    seen: list[str] = []
    engine = committed.sessionmaker.kw["bind"].sync_engine
    connect = asyncpg.connect

    def logged(query: Any) -> None:
        seen.append(query.query)

    async def connect_logged(*args: Any, **kwargs: Any) -> asyncpg.Connection:
        # The statement pool's connections, which the reads below are the first to open.
        connection = await connect(*args, **kwargs)
        connection.add_query_logger(logged)
        return connection

    def log_on_checkout(dbapi_connection: Any, *_: Any) -> None:
        # The same callback again is one logger: a connection checked out twice logs once.
        dbapi_connection.driver_connection.add_query_logger(logged)

    def record(*args: Any) -> None:
        seen.append(args[2])

    monkeypatch.setattr(asyncpg, "connect", connect_logged)
    event.listen(engine, "checkout", log_on_checkout)
    event.listen(engine, "before_cursor_execute", record)
    try:
        for method, path, body in _reads(cited["citation_id"]):
            seen.clear()
            response = await client.request(
                method, path, json=body, headers=keys.headers("support")
            )
            await asyncio.sleep(0)
            assert response.status_code == 200, response.text
            assert len(seen) == 1, seen
            assert "FROM api_keys" in seen[0]
    finally:
        event.remove(engine, "checkout", log_on_checkout)
        event.remove(engine, "before_cursor_execute", record)


async def test_keyed_reads_run_in_a_session_where_the_budget_leaves_no_statement_pool(
    committed: Committed,
) -> None:
    client, keys = committed.client, committed.keys
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    url = committed.owner.url.render_as_string(hide_password=False)
    small = create_app(Settings(database_url=url, db_max_connections=3))

    async with serving(small) as other:
        assert small.state.statements is None
        for method, path, body in _reads(cited["citation_id"]):
            pooled = await client.request(method, path, json=body, headers=keys.headers("support"))
            in_session = await other.request(
                method, path, json=body, headers=keys.headers("support")
            )
            assert pooled.status_code == in_session.status_code == 200, in_session.text
            assert in_session.json() == pooled.json()


async def test_a_keyed_read_on_a_lost_connection_is_503_and_the_next_one_is_served(
    committed: Committed,
) -> None:
    client, keys = committed.client, committed.keys
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    path = f"/v1/citations/{cited['citation_id']}/excerpt"
    assert (await client.get(path, headers=keys.headers("support"))).status_code == 200
    async with committed.owner.connect() as owner:
        await owner.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE usename = 'grounding_app' AND datname = current_database()"
            )
        )

    lost = await client.get(path, headers=keys.headers("support"))
    again = await client.get(path, headers=keys.headers("support"))

    assert lost.status_code == 503, lost.text
    assert lost.json()["code"] == "service_unavailable"
    assert "retry-after" in lost.headers
    assert again.status_code == 200, again.text


async def test_the_keyed_statement_reads_nothing_for_a_key_that_does_not_open(
    client: httpx.AsyncClient,
    keys: Keys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    cid = cited["citation_id"]
    support = keys.secrets[("acme", "support")]
    revoked = await _create_key(client, keys, scopes=["support"])
    assert (
        await client.delete(f"/v1/admin/keys/{revoked['key_id']}", headers=keys.headers("admin"))
    ).status_code == 200
    readers = frozenset({"support"})
    cases = {
        "opens": (support, readers),
        "wrong secret": (support[:-1] + ("A" if support[-1] != "A" else "B"), readers),
        "revoked": (revoked["secret"], readers),
        "lacks the scope": (support, frozenset({"audit"})),
    }

    found = {}
    for name, (secret, scopes) in cases.items():
        reader = access.Reader(secret=secret, scopes=scopes)
        # A fresh session each time: outside the statement, no tenant is set.
        async with sessionmaker() as session, session.begin():
            rows = await db.fetch(session, citations._RESOLVE_KEYED, *reader.key_arguments(), [cid])
        found[name] = [row["citation_id"] for row in rows]

    assert found == {
        "opens": [cid],
        "wrong secret": [None],
        "revoked": [None],
        "lacks the scope": [None],
    }


async def test_keyed_reads_refuse_every_key_that_does_not_open_alike(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    support = keys.secrets[("acme", "support")]
    other = keys.secrets[("acme", "agent")]
    spliced = "_".join(support.split("_")[:3]) + "_" + other.split("_", 3)[3]
    refused = ["gsk_key_ffffffffffffffff_nosuchkey", support[:-1] + "x", spliced, "nonsense"]

    for method, path, body in _reads(cited["citation_id"]):
        responses = [
            await client.request(
                method, path, json=body, headers={"Authorization": f"Bearer {secret}"}
            )
            for secret in refused
        ]
        assert {r.status_code for r in responses} == {401}
        assert {r.text for r in responses} == {responses[0].text}
        assert responses[0].headers["www-authenticate"] == "Bearer"


async def test_a_revoked_key_reads_no_excerpt_on_the_next_request(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    issued = await _create_key(client, keys, scopes=["support"])
    headers = {"Authorization": f"Bearer {issued['secret']}"}
    reads = _reads(cited["citation_id"])
    for method, path, body in reads:
        assert (await client.request(method, path, json=body, headers=headers)).status_code == 200

    revoking = await client.delete(
        f"/v1/admin/keys/{issued['key_id']}", headers=keys.headers("admin")
    )

    assert revoking.status_code == 200
    for method, path, body in reads:
        after = await client.request(method, path, json=body, headers=headers)
        assert after.status_code == 401
        assert POLICY_TEXT[:12] not in after.text


async def test_excerpt_and_resolve_bodies_are_exactly_their_schemas(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = policy_chunks()
    await register_version(client, keys, chunks=chunks)
    await register_version(client, keys, version="2026-12-01", chunks=chunks)
    [live, *_] = await _cite(client, keys, chunks)
    [erased, *_] = await _cite(client, keys, chunks, version="2026-12-01")
    await erase_document(client, keys, versions=["2026-12-01"])

    bodies = [(await _excerpt(client, keys, c["citation_id"])).json() for c in (live, erased)]
    resolved = await _resolve(client, keys, [live["citation_id"], erased["citation_id"], "cit_x"])

    excerpt, tombstone = bodies
    assert Excerpt.model_validate(excerpt).model_dump(mode="json") == excerpt
    assert list(Excerpt.model_validate(excerpt).model_dump(mode="json")) == list(excerpt)
    assert Tombstone.model_validate(tombstone).model_dump(mode="json") == tombstone
    assert list(Tombstone.model_validate(tombstone).model_dump(mode="json")) == list(tombstone)
    read = ResolveRead.model_validate({"results": resolved})
    assert read.model_dump(mode="json") == {"results": resolved}
    assert [r["status"] for r in resolved] == ["excerpt", "tombstone", "not_found"]
    assert resolved[0] == excerpt | {"status": "excerpt"}
    assert resolved[1] == tombstone | {"status": "tombstone"}


async def test_an_admin_reads_excerpts_as_the_tenant_it_names(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    as_acme = keys.headers("admin", tenant="globex") | {"X-Grounding-Tenant": "acme"}
    own = keys.headers("admin", tenant="globex")

    for method, path, body in _reads(cited["citation_id"]):
        named = await client.request(method, path, json=body, headers=as_acme)
        unnamed = await client.request(method, path, json=body, headers=own)
        assert named.status_code == 200, named.text
        assert POLICY_TEXT[cited["span"]["start"] : cited["span"]["end"]] in named.text
        assert unnamed.status_code in (200, 404)
        assert POLICY_TEXT[:12] not in unnamed.text


async def test_the_reads_that_take_the_named_tenant_themselves_refuse_it_as_fastapi_would(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = await _cite(client, keys, policy_chunks())
    too_long = keys.headers("admin", tenant="globex") | {"X-Grounding-Tenant": "x" * 129}
    # A route whose principal is a dependency, where FastAPI validates the header parameter.
    by_fastapi = await client.get(f"/v1/citations/{cited['citation_id']}", headers=too_long)
    assert by_fastapi.status_code == 422

    for method, path, body in _reads(cited["citation_id"]):
        refused = await client.request(method, path, json=body, headers=too_long)
        assert refused.status_code == 422, path
        assert refused.json() == by_fastapi.json()
        assert refused.json()["errors"][0]["loc"] == ["header", "x-grounding-tenant"]


def test_the_reads_that_take_the_named_tenant_themselves_document_it_as_fastapi_would(
    app: FastAPI,
) -> None:
    paths = app.openapi()["paths"]

    def named_tenant(operation: dict[str, Any]) -> list[dict[str, Any]]:
        return [p for p in operation.get("parameters", []) if p["in"] == "header"]

    by_fastapi = named_tenant(paths["/v1/citations/{citation_id}"]["get"])
    assert [p["name"] for p in by_fastapi] == ["x-grounding-tenant"]
    assert named_tenant(paths["/v1/citations/{citation_id}/excerpt"]["get"]) == by_fastapi
    assert named_tenant(paths["/v1/citations/resolve"]["post"]) == by_fastapi


# A small tenant, as in the benchmark: fifty documents of one version each, cited a thousand
# times, and one document registered six hundred times over.
_SMALL_TENANT = [
    """
    INSERT INTO document_versions (tenant, document_id, version, chunk_count, created_at)
    SELECT 'acme', 'doc_' || d, 'v1', 1, now() FROM generate_series(1, 50) AS d
    UNION ALL
    SELECT 'acme', 'doc_often', 'v' || g, 1, now() FROM generate_series(1, 600) AS g
    """,
    """
    INSERT INTO runs (tenant, run_id, query, scope, retrieved_at, key_id, citation_count)
    SELECT 'acme', 'run_' || g, 'how long?', 'HANDBOOK', now(), 'key_1', 1
      FROM generate_series(1, 1000) AS g
    """,
    """
    INSERT INTO citations (tenant, citation_id, run_id, ordinal, document_id, document_version,
                           chunk_id, span_start, span_end, utf8_start, utf8_end, utf16_start,
                           utf16_end, score, branches, retrieved_at, span_hmac)
    SELECT 'acme', 'cit_' || g, 'run_' || g, 0, 'doc_' || (1 + g % 50), 'v1', 'c1',
           0, 10, 0, 10, 0, 10, 0.5, '{}', now(), repeat('0', 64)
      FROM generate_series(1, 1000) AS g
    """,
    "ANALYZE document_versions, runs, citations",
]


def _literal(value: object) -> str:
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]::text[]"
    return "'" + str(value).replace("'", "''") + "'"


async def test_a_resolve_reads_each_citation_s_own_rows_whatever_the_tenant_holds(
    committed: Committed,
) -> None:
    async with committed.owner.begin() as connection:
        for statement in _SMALL_TENANT:
            await connection.execute(text(statement))
    reader = Reader(committed.keys.secrets[("acme", "support")], frozenset(READERS))
    for count in (1, 100):
        ids = [f"cit_{g}" for g in range(1, count + 1)]
        for statement, arguments in (
            (citations._RESOLVE_KEYED, [*reader.key_arguments(), ids]),
            (citations._RESOLVE, ["acme", ids]),
        ):
            async with committed.sessionmaker() as session, session.begin():
                await db.scope_to_tenant(session, "acme")
                # As `db.StatementPool` plans it: once, for any tenant and any number of ids.
                await session.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
                raw = await (await session.connection()).get_raw_connection()
                driver = raw.driver_connection
                assert driver is not None
                await driver.execute(f"PREPARE resolving AS {statement}")
                listed = ", ".join(_literal(a) for a in arguments)
                [explained] = await driver.fetchval(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE resolving({listed})"
                )
                await driver.execute("DEALLOCATE resolving")
            read: dict[str, float] = {}
            for node in plan_nodes(explained["Plan"]):
                if "Relation Name" in node:
                    rows = node["Actual Rows"] * node["Actual Loops"]
                    read[node["Relation Name"]] = read.get(node["Relation Name"], 0) + rows
            # Each citation's own rows, its version and its document's newest; never every
            # version of the tenant, hashed or merged, for every read.
            assert read["citations"] == count
            assert read["document_versions"] <= 2 * count, (count, read)


async def test_a_resolved_row_ends_with_the_columns_its_body_is_read_from_in_order(
    committed: Committed,
) -> None:
    # `_body` unpacks a row's last columns by position: a column added, removed or moved in
    # the statement must be one in `_body` too.
    read_by_body = [
        "citation_id",
        "document_id",
        "document_version",
        "span_start",
        "span_end",
        "uri",
        "page",
        "section",
        "span_sha256",
        "chunk_text",
        "chunk_start",
        "erased_at",
        "request_ref",
        "superseded_by",
    ]
    async with committed.owner.connect() as connection:
        driver = (await connection.get_raw_connection()).driver_connection
        assert driver is not None
        for statement, before in ((citations._RESOLVE, 0), (citations._RESOLVE_KEYED, 4)):
            prepared = await driver.prepare(statement)
            names = [attribute.name for attribute in prepared.get_attributes()]
            assert names[before:] == read_by_body
            assert names[-citations._RESOLVED_WIDTH :] == read_by_body


# What a resolved row puts in a body: text of any code points a database can hold, offsets and
# pages, flags, nulls, and the timestamps PostgreSQL gives back (UTC, to the microsecond).
_row_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.text(st.characters(exclude_categories=["Cs"])),
    st.datetimes(timezones=st.just(UTC)),
)


@given(
    st.recursive(
        _row_values,
        lambda inner: st.dictionaries(st.text(), inner, max_size=6) | st.lists(inner, max_size=6),
        max_leaves=30,
    )
)
def test_bodies_are_written_as_pydantic_writes_them(body: Any) -> None:
    assert json_response(body).body == pydantic_core.to_json(body)
