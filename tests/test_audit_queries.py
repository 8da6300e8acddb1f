"""Audit queries over HTTP: filters, newest-first keyset pages that survive concurrent writes,
limits, scopes, one tenant for audit keys and every tenant for admin keys (each read recorded),
a source's blast radius and the daily counts."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import scope_to_tenant
from app.models import AdminRead, AuditEntry, Verification
from tests.factories import (
    POLICY_TEXT,
    Keys,
    claim,
    erase_document,
    policy_chunks,
    record_run,
    register_version,
    results_for,
    submit_answer,
)

SHIPPING_TEXT = "Parcels ship within two days 📦 and arrive within a week. 配送は二日以内です。"
LISTS = ("/v1/audit/runs", "/v1/audit/verifications", "/v1/audit/erasures")
_MAX_PAGES = 20


def _key_id(keys: Keys, scope: str, tenant: str = "acme") -> str:
    # Secrets read gsk_<key_id>_<random>, and key ids key_<hex>.
    return "key_" + keys.secrets[(tenant, scope)].split("_", 3)[2]


async def _get(
    client: httpx.AsyncClient,
    keys: Keys,
    path: str,
    *,
    scope: str = "audit",
    key_tenant: str = "acme",
    expect: int = 200,
    **params: Any,
) -> Any:
    headers = keys.headers(scope, tenant=key_tenant)
    response = await client.get(path, params=params, headers=headers)
    assert response.status_code == expect, response.text
    return response.json()


async def _pages(
    client: httpx.AsyncClient, keys: Keys, path: str, *, scope: str = "audit", **params: Any
) -> list[Any]:
    """Every page of a list, following `next_cursor` to its end."""
    pages: list[Any] = []
    extra: dict[str, Any] = {}
    for _ in range(_MAX_PAGES):
        pages.append(await _get(client, keys, path, scope=scope, **params, **extra))
        if pages[-1]["next_cursor"] is None:
            return pages
        extra = {"cursor": pages[-1]["next_cursor"]}
    raise AssertionError(f"{path} pages on past {_MAX_PAGES} pages")


async def _all(
    client: httpx.AsyncClient, keys: Keys, path: str, *, scope: str = "audit", **params: Any
) -> list[dict[str, Any]]:
    """Every item of a list, page by page."""
    pages = await _pages(client, keys, path, scope=scope, **params)
    return [item for page in pages for item in page["items"]]


async def _refusal(client: httpx.AsyncClient, keys: Keys, run_id: str, tenant: str) -> str:
    body = await submit_answer(
        client, keys, run_id, claims=[], citations=[], refusal=True, tenant=tenant
    )
    return str(body["verification_id"])


async def _history(
    client: httpx.AsyncClient, keys: Keys, *, tenant: str = "acme"
) -> dict[str, Any]:
    """Two documents, a run on each, every outcome of verification, a memory record."""
    await register_version(client, keys, tenant=tenant)
    shipping = [{"chunk_id": "s1", "start": 0, "end": len(SHIPPING_TEXT)}]
    await register_version(
        client,
        keys,
        tenant=tenant,
        document_id="shipping",
        version="v1",
        text=SHIPPING_TEXT,
        chunks=shipping,
    )
    refunds = await record_run(client, keys, tenant=tenant)
    parcels = await record_run(
        client,
        keys,
        tenant=tenant,
        results=results_for(shipping, document_id="shipping", version="v1"),
    )
    first = refunds["citations"][0]["citation_id"]
    grounded = await submit_answer(
        client,
        keys,
        refunds["run_id"],
        claims=[claim("Refunds take thirty days.", first)],
        citations=refunds["citations"],
        tenant=tenant,
    )
    rejected = await submit_answer(
        client,
        keys,
        refunds["run_id"],
        claims=[claim("Refunds take thirty days.", first), claim("And are instant.")],
        citations=refunds["citations"],
        tenant=tenant,
        expect=422,
    )
    refused = await _refusal(client, keys, parcels["run_id"], tenant)
    memory = await client.post(
        "/v1/memory",
        json={"text": "Refunds take thirty days.", "citation_ids": [first]},
        headers=keys.headers("agent", tenant=tenant),
    )
    assert memory.status_code == 201, memory.text
    return {
        "runs": [refunds["run_id"], parcels["run_id"]],
        "refund_citations": refunds["citations"],
        "grounded": grounded["verification_id"],
        "rejected": rejected["verification_id"],
        "refused": refused,
        "memory": memory.json()["memory_id"],
    }


@pytest.mark.parametrize(
    "path",
    [*LISTS, "/v1/audit/stats", "/v1/audit/citations?document_id=refund-policy"],
)
async def test_audit_reads_need_a_key_with_the_audit_or_admin_scope(
    client: httpx.AsyncClient, keys: Keys, path: str
) -> None:
    assert (await client.get(path)).status_code == 401
    bad = {"Authorization": "Bearer gsk_key_0000000000000000_nothing"}
    assert (await client.get(path, headers=bad)).status_code == 401
    for scope in ("ingest", "agent", "support"):
        response = await client.get(path, headers=keys.headers(scope))
        assert (response.status_code, response.json()["code"]) == (403, "forbidden"), scope
    for scope in ("audit", "admin"):
        assert (await client.get(path, headers=keys.headers(scope))).status_code == 200, scope


async def test_runs_are_newest_first_and_filter_by_run_key_document_and_time(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    history = await _history(client, keys)
    refunds, parcels = history["runs"]
    page = await _get(client, keys, "/v1/audit/runs")
    assert [r["run_id"] for r in page["items"]] == [parcels, refunds]
    assert page["next_cursor"] is None
    newest = page["items"][0]
    assert newest == {
        "run_id": parcels,
        "tenant": "acme",
        "key_id": _key_id(keys, "agent"),
        "query": "how long do refunds take?",
        "scope": "HANDBOOK",
        "retrieved_at": newest["retrieved_at"],
        "citation_count": 1,
    }

    async def ids(**params: Any) -> list[str]:
        return [
            r["run_id"] for r in (await _get(client, keys, "/v1/audit/runs", **params))["items"]
        ]

    assert await ids(document_id="shipping") == [parcels]
    assert await ids(document_id="refund-policy") == [refunds]
    assert await ids(document_id="no-such-document") == []
    assert await ids(run_id=refunds) == [refunds]
    assert await ids(key_id=_key_id(keys, "agent")) == [parcels, refunds]
    assert await ids(key_id=_key_id(keys, "audit")) == []
    assert await ids(since=newest["retrieved_at"]) == [parcels]
    assert await ids(until=newest["retrieved_at"]) == [refunds]
    assert await ids(since=newest["retrieved_at"], run_id=refunds) == []


async def test_verifications_filter_by_outcome_code_run_document_key_and_time(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    history = await _history(client, keys)
    refunds, parcels = history["runs"]
    items = (await _get(client, keys, "/v1/audit/verifications"))["items"]
    assert [v["verification_id"] for v in items] == [
        history["refused"],
        history["rejected"],
        history["grounded"],
    ]
    rejected = items[1]
    assert rejected == {
        "verification_id": history["rejected"],
        "run_id": refunds,
        "tenant": "acme",
        "key_id": _key_id(keys, "agent"),
        "outcome": "rejected",
        "code": "uncited_claim",
        "claim_count": 2,
        "citation_count": 4,
        "violation_count": 1,
        "created_at": rejected["created_at"],
    }

    async def ids(**params: Any) -> list[str]:
        page = await _get(client, keys, "/v1/audit/verifications", **params)
        return [v["verification_id"] for v in page["items"]]

    assert await ids(outcome="grounded") == [history["grounded"]]
    assert await ids(outcome="refused") == [history["refused"]]
    assert await ids(code="uncited_claim") == [history["rejected"]]
    assert await ids(code="tenant_crossing") == []
    assert await ids(run_id=parcels) == [history["refused"]]
    # Resting on a document: through the citations the claims name.
    assert await ids(document_id="refund-policy") == [history["rejected"], history["grounded"]]
    assert await ids(document_id="shipping") == []
    assert await ids(key_id=_key_id(keys, "agent"), outcome="rejected") == [history["rejected"]]
    assert await ids(key_id=_key_id(keys, "support")) == []
    assert await ids(since=rejected["created_at"]) == [history["refused"], history["rejected"]]
    assert await ids(until=rejected["created_at"]) == [history["grounded"]]
    await _get(client, keys, "/v1/audit/verifications", outcome="failed", expect=422)


async def test_erasures_filter_by_document_key_and_time_and_keep_the_reason_out(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await _history(client, keys)
    first = await erase_document(client, keys, reason="a private reason", request_ref="DSR-7")
    second = await erase_document(client, keys, document_id="shipping", request_ref="DSR-8")
    page = await _get(client, keys, "/v1/audit/erasures")
    assert [e["erasure_id"] for e in page["items"]] == [second["erasure_id"], first["erasure_id"]]
    assert page["items"][1] == {
        "erasure_id": first["erasure_id"],
        "tenant": "acme",
        "document_id": "refund-policy",
        "versions": ["2026-11-03"],
        "request_ref": "DSR-7",
        "key_id": _key_id(keys, "ingest"),
        "erased_at": page["items"][1]["erased_at"],
    }
    assert "a private reason" not in json.dumps(page)

    async def ids(**params: Any) -> list[str]:
        items = (await _get(client, keys, "/v1/audit/erasures", **params))["items"]
        return [e["erasure_id"] for e in items]

    assert await ids(document_id="shipping") == [second["erasure_id"]]
    assert await ids(key_id=_key_id(keys, "ingest"), document_id="refund-policy") == [
        first["erasure_id"]
    ]
    assert await ids(key_id=_key_id(keys, "agent")) == []
    assert await ids(since=page["items"][0]["erased_at"]) == [second["erasure_id"]]


async def test_pages_neither_skip_nor_repeat_rows_written_between_them(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    run = (await record_run(client, keys))["run_id"]
    for _ in range(5):
        await _refusal(client, keys, run, "acme")
    before = [v["verification_id"] for v in await _all(client, keys, "/v1/audit/verifications")]
    assert len(before) == 5

    seen: list[str] = []
    cursor = None
    for _ in range(3):
        extra: dict[str, Any] = {"cursor": cursor} if cursor else {}
        page = await _get(client, keys, "/v1/audit/verifications", limit=2, **extra)
        seen += [v["verification_id"] for v in page["items"]]
        cursor = page["next_cursor"]
        # Newer rows land ahead of the pages already read, and must not shift the rest.
        await _refusal(client, keys, run, "acme")
        await _refusal(client, keys, run, "acme")
    assert seen == before
    assert cursor is None


async def test_rows_written_in_the_same_microsecond_are_paged_by_id(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await register_version(client, keys)
    run = (await record_run(client, keys))["run_id"]
    at = datetime.now(UTC)
    ids = [f"ver_same_time_{i}" for i in range(7)]
    async with sessionmaker() as session, session.begin():
        await scope_to_tenant(session, "acme")
        await session.execute(
            insert(Verification),
            [
                {
                    "tenant": "acme",
                    "verification_id": verification_id,
                    "run_id": run,
                    "key_id": "key_x",
                    "outcome": "refused",
                    "code": None,
                    "violations": [],
                    "claims": [],
                    "provenance": [],
                    "claim_count": 0,
                    "citation_count": 0,
                    "answer_sha256": "0" * 64,
                    "created_at": at,
                }
                for verification_id in ids
            ],
        )
    pages = await _pages(client, keys, "/v1/audit/verifications", run_id=run, limit=3)
    assert [[v["verification_id"] for v in page["items"]] for page in pages] == [
        ids[6:3:-1],
        ids[3:0:-1],
        ids[0:1],
    ]


def _forged(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 1001},
        {"limit": 0},
        {"limit": "ten"},
        {"cursor": "not a cursor!"},
        {"cursor": _forged(["yesterday", "ver_x", "acme"])},
        {"cursor": _forged(["2026-12-01T00:00:00", "ver_x", "acme"])},
        {"cursor": _forged({"v": None})},
        {"cursor": base64.urlsafe_b64encode(b"[" * 1500).decode()},
        {"since": "2026-12-01T00:00:00"},
        {"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"},
        {"outcomes": "grounded"},
    ],
)
async def test_bad_limits_cursors_times_and_unknown_filters_are_rejected(
    client: httpx.AsyncClient, keys: Keys, params: dict[str, Any]
) -> None:
    body = await _get(client, keys, "/v1/audit/verifications", expect=422, **params)
    assert body["code"] == "validation_error"


async def test_a_page_holds_up_to_a_thousand_items_and_a_hundred_by_default(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await register_version(client, keys)
    run = (await record_run(client, keys))["run_id"]
    start = datetime.now(UTC)
    async with sessionmaker() as session, session.begin():
        await scope_to_tenant(session, "acme")
        await session.execute(
            insert(Verification),
            [
                {
                    "tenant": "acme",
                    "verification_id": f"ver_{i:04}",
                    "run_id": run,
                    "key_id": "key_x",
                    "outcome": "refused",
                    "violations": [],
                    "claims": [],
                    "provenance": [],
                    "claim_count": 0,
                    "citation_count": 0,
                    "answer_sha256": "0" * 64,
                    "created_at": start + timedelta(milliseconds=i),
                }
                for i in range(1001)
            ],
        )
    default = await _get(client, keys, "/v1/audit/verifications")
    assert len(default["items"]) == 100
    assert default["items"][0]["verification_id"] == "ver_1000"
    full = await _get(client, keys, "/v1/audit/verifications", limit=1000)
    assert len(full["items"]) == 1000
    last = await _get(client, keys, "/v1/audit/verifications", cursor=full["next_cursor"])
    assert [v["verification_id"] for v in last["items"]] == ["ver_0000"]
    assert last["next_cursor"] is None


async def test_a_run_in_full_shows_erased_citations_and_every_attempt_newest_first(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    history = await _history(client, keys)
    refunds = history["runs"][0]
    erasure = await erase_document(client, keys)
    body = await _get(client, keys, f"/v1/audit/runs/{refunds}")
    assert (body["run_id"], body["tenant"], body["citation_count"]) == (refunds, "acme", 4)
    issued = history["refund_citations"]
    assert [c["citation_id"] for c in body["citations"]] == [c["citation_id"] for c in issued]
    assert [c["ordinal"] for c in body["citations"]] == [0, 1, 2, 3]
    assert body["citations"][0] == {
        "citation_id": issued[0]["citation_id"],
        "ordinal": 0,
        "document_id": "refund-policy",
        "document_version": "2026-11-03",
        "chunk_id": "c1",
        "span": issued[0]["span"],
        "score": issued[0]["score"],
        "erased": True,
        "erased_at": erasure["erased_at"],
        "erasure_id": erasure["erasure_id"],
    }
    assert [v["verification_id"] for v in body["verifications"]] == [
        history["rejected"],
        history["grounded"],
    ]
    live = await _get(client, keys, f"/v1/audit/runs/{history['runs'][1]}")
    assert [(c["erased"], c["erased_at"]) for c in live["citations"]] == [(False, None)]


async def test_unknown_and_other_tenants_runs_are_not_found_alike(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    history = await _history(client, keys)
    theirs = await _get(
        client, keys, f"/v1/audit/runs/{history['runs'][0]}", key_tenant="globex", expect=404
    )
    unknown = await _get(client, keys, "/v1/audit/runs/run_never_was", expect=404)
    assert theirs == unknown
    assert theirs["code"] == "not_found"


async def test_an_audit_key_reads_only_its_own_tenant(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    acme = await _history(client, keys)
    await erase_document(client, keys)
    globex = await _history(client, keys, tenant="globex")
    await erase_document(client, keys, tenant="globex")
    for path in LISTS:
        items = await _all(client, keys, path)
        assert items, path
        assert {item["tenant"] for item in items} == {"acme"}, path
        assert await _all(client, keys, path, tenant="globex") == [], path
    stats = await _get(client, keys, "/v1/audit/stats")
    assert {row["tenant"] for row in stats["items"]} == {"acme"}
    blast = await _get(client, keys, "/v1/audit/citations", document_id="refund-policy")
    assert {v["verification_id"] for v in blast["verifications"]} == {
        acme["grounded"],
        acme["rejected"],
    }
    assert [m["memory_id"] for m in blast["memory_records"]] == [acme["memory"]]
    await _get(client, keys, f"/v1/audit/runs/{globex['runs'][0]}", expect=404)


async def _admin_reads(sessionmaker: async_sessionmaker[AsyncSession]) -> list[AdminRead]:
    async with sessionmaker() as session, session.begin():
        await scope_to_tenant(session, "acme")
        rows = await session.execute(select(AdminRead).order_by(AdminRead.read_at))
        return list(rows.scalars())


async def test_an_admin_key_reads_every_tenant_and_each_read_is_recorded(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    acme = await _history(client, keys)
    globex = await _history(client, keys, tenant="globex")
    await _get(client, keys, "/v1/audit/runs")
    assert await _admin_reads(sessionmaker) == [], "an audit key's own reads are not admin reads"

    runs = await _get(client, keys, "/v1/audit/runs", scope="admin")
    assert {(r["tenant"], r["run_id"]) for r in runs["items"]} == {
        *(("acme", run) for run in acme["runs"]),
        *(("globex", run) for run in globex["runs"]),
    }
    times = [r["retrieved_at"] for r in runs["items"]]
    assert times == sorted(times, reverse=True)
    only = await _get(
        client, keys, "/v1/audit/verifications", scope="admin", tenant="globex", outcome="grounded"
    )
    assert [(v["tenant"], v["verification_id"]) for v in only["items"]] == [
        ("globex", globex["grounded"])
    ]
    theirs = await _get(client, keys, f"/v1/audit/runs/{globex['runs'][0]}", scope="admin")
    assert (theirs["tenant"], len(theirs["verifications"])) == ("globex", 2)
    blast = await _get(
        client, keys, "/v1/audit/citations", scope="admin", document_id="refund-policy"
    )
    assert {m["tenant"] for m in blast["memory_records"]} == {"acme", "globex"}

    reads = await _admin_reads(sessionmaker)
    assert [(r.tenant, r.key_id, r.route) for r in reads] == [
        ("acme", _key_id(keys, "admin"), "/v1/audit/runs"),
        ("acme", _key_id(keys, "admin"), "/v1/audit/verifications"),
        ("acme", _key_id(keys, "admin"), f"/v1/audit/runs/{globex['runs'][0]}"),
        ("acme", _key_id(keys, "admin"), "/v1/audit/citations"),
    ]
    assert reads[0].filters == {"limit": 100}
    assert reads[1].filters == {"tenant": "globex", "outcome": "grounded", "limit": 100}
    async with sessionmaker() as session, session.begin():
        await scope_to_tenant(session, "acme")
        logged = await session.execute(
            select(AuditEntry.record_id).where(AuditEntry.kind == "admin_read")
        )
        assert sorted(logged.scalars()) == sorted(r.read_id for r in reads)
    # The read ran as the auditor for its own statements only: the connection writes again.
    await record_run(client, keys)


async def test_an_admin_read_that_fails_leaves_no_record_and_no_auditor_role(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await _get(client, keys, "/v1/audit/runs/run_never_was", scope="admin", expect=404)
    assert await _admin_reads(sessionmaker) == []
    async with sessionmaker() as session, session.begin():
        role = await session.scalar(text("SELECT current_user"))
    assert role == "grounding_app"


async def test_blast_radius_lists_grounded_verifications_first_then_newest(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    await register_version(client, keys, version="2026-12-01")
    run = await record_run(client, keys)
    newer = await record_run(
        client, keys, results=results_for(policy_chunks(), version="2026-12-01")
    )
    cited = run["citations"]

    async def answer(*claims: dict[str, Any], expect: int = 200) -> str:
        body = await submit_answer(
            client, keys, run["run_id"], claims=list(claims), citations=cited, expect=expect
        )
        return str(body["verification_id"])

    old_grounded = await answer(claim("Refunds take a month.", cited[0]["citation_id"]))
    rejected = await answer(
        claim("Refunds take a month.", cited[1]["citation_id"]), claim("Unsupported."), expect=422
    )
    new_grounded = await answer(claim("Receipts are needed.", cited[3]["citation_id"]))
    await _refusal(client, keys, run["run_id"], "acme")
    await submit_answer(
        client,
        keys,
        newer["run_id"],
        claims=[claim("Refunds take a month.", newer["citations"][0]["citation_id"])],
        citations=newer["citations"],
    )
    memories = []
    for citation in cited[:2]:
        response = await client.post(
            "/v1/memory",
            json={"text": "Refunds take a month.", "citation_ids": [citation["citation_id"]]},
            headers=keys.headers("agent"),
        )
        memories.append(response.json()["memory_id"])

    params: dict[str, Any] = {"document_id": "refund-policy", "version": "2026-11-03"}
    body = await _get(client, keys, "/v1/audit/citations", **params)
    assert (body["document_id"], body["version"], body["next_cursor"]) == (
        "refund-policy",
        "2026-11-03",
        None,
    )
    expected = [new_grounded, old_grounded, rejected]
    assert [v["verification_id"] for v in body["verifications"]] == expected
    assert [v["outcome"] for v in body["verifications"]] == ["grounded", "grounded", "rejected"]
    assert [m["memory_id"] for m in body["memory_records"]] == memories[::-1]

    # One item of each list a page, to the end of both.
    pages = [
        (
            [v["verification_id"] for v in page["verifications"]],
            [m["memory_id"] for m in page["memory_records"]],
        )
        for page in await _pages(client, keys, "/v1/audit/citations", limit=1, **params)
    ]
    assert pages == [
        ([new_grounded], [memories[1]]),
        ([old_grounded], [memories[0]]),
        ([rejected], []),
    ]
    other = await _get(
        client, keys, "/v1/audit/citations", document_id="refund-policy", version="2026-12-01"
    )
    assert [v["outcome"] for v in other["verifications"]] == ["grounded"]
    assert other["memory_records"] == []
    every = await _get(client, keys, "/v1/audit/citations", document_id="refund-policy")
    assert len(every["verifications"]) == 4
    await _get(client, keys, "/v1/audit/citations", expect=422)


async def test_stats_count_verifications_by_day_tenant_outcome_and_code(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await _history(client, keys)
    globex = await _history(client, keys, tenant="globex")
    await _refusal(client, keys, globex["runs"][0], "globex")
    today = datetime.now(UTC).date().isoformat()
    acme = await _get(client, keys, "/v1/audit/stats")
    assert acme["items"] == [
        {"day": today, "tenant": "acme", "outcome": "grounded", "code": None, "count": 1},
        {"day": today, "tenant": "acme", "outcome": "refused", "code": None, "count": 1},
        {
            "day": today,
            "tenant": "acme",
            "outcome": "rejected",
            "code": "uncited_claim",
            "count": 1,
        },
    ]
    every = await _get(client, keys, "/v1/audit/stats", scope="admin")
    assert [(r["tenant"], r["outcome"], r["count"]) for r in every["items"]] == [
        ("acme", "grounded", 1),
        ("acme", "refused", 1),
        ("acme", "rejected", 1),
        ("globex", "grounded", 1),
        ("globex", "refused", 2),
        ("globex", "rejected", 1),
    ]
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    later = await _get(client, keys, "/v1/audit/stats", since=tomorrow)
    assert (later["since"] is not None, later["items"]) == (True, [])


async def test_audit_bodies_carry_no_document_memory_or_claim_text(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    history = await _history(client, keys)
    reads: list[tuple[str, dict[str, Any]]] = [
        *((path, {}) for path in LISTS),
        ("/v1/audit/stats", {}),
        (f"/v1/audit/runs/{history['runs'][0]}", {}),
        ("/v1/audit/citations", {"document_id": "refund-policy"}),
    ]
    bodies = [
        await _get(client, keys, path, scope=scope, **params)
        for scope in ("audit", "admin")
        for path, params in reads
    ]
    seen = json.dumps(bodies, ensure_ascii=False)
    fragments = [POLICY_TEXT[c["start"] : c["start"] + 12] for c in policy_chunks()]
    fragments += [SHIPPING_TEXT[:12], "Refunds take thirty days", "And are instant"]
    assert [f for f in fragments if f in seen] == []
    assert history["grounded"] in seen


async def test_admin_reads_are_kept_in_the_admin_keys_tenant_under_row_level_security(
    client: httpx.AsyncClient, keys: Keys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await _get(client, keys, "/v1/audit/erasures", scope="admin", key_tenant="globex")
    assert await _admin_reads(sessionmaker) == []
    async with sessionmaker() as session, session.begin():
        await scope_to_tenant(session, "globex")
        reads = list((await session.execute(select(AdminRead))).scalars())
        unscoped = await session.execute(text("SELECT count(*) FROM admin_reads WHERE true"))
    assert [(r.tenant, r.key_id) for r in reads] == [("globex", _key_id(keys, "admin", "globex"))]
    assert unscoped.scalar() == 1
