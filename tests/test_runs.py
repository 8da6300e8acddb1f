"""Retrieval runs over HTTP: citations issued per result, configuration errors, reading back."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from app.config import Settings
from app.main import create_app
from tests.conftest import statements_sent
from tests.factories import (
    POLICY_TEXT,
    Keys,
    many_chunks,
    policy_chunks,
    record_run,
    register_version,
    results_for,
)

PROBLEM_JSON = "application/problem+json"
CITATION_FIELDS = {
    "citation_id",
    "run_id",
    "tenant",
    "document_id",
    "document_version",
    "chunk_id",
    "span",
    "score",
    "branches",
    "retrieved_at",
    "locator",
    "span_sha256",
    "span_utf8",
    "span_utf16",
}
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"  # man, woman, girl, boy


def _utf8(text: str, position: int) -> int:
    return len(text[:position].encode("utf-8"))


def _utf16(text: str, position: int) -> int:
    return len(text[:position].encode("utf-16-le")) // 2


def _pinned(text: str, start: int, end: int) -> dict[str, Any]:
    """What a citation of `text[start:end]` must pin, computed independently of the service."""
    return {
        "span": {"start": start, "end": end},
        "span_utf8": {"start": _utf8(text, start), "end": _utf8(text, end)},
        "span_utf16": {"start": _utf16(text, start), "end": _utf16(text, end)},
        "span_sha256": hashlib.sha256(text[start:end].encode("utf-8")).hexdigest(),
    }


def _assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == f"urn:grounding:problem:{code}"
    return body


async def _post_run(
    client: httpx.AsyncClient, keys: Keys, results: list[dict[str, Any]], *, tenant: str = "acme"
) -> httpx.Response:
    return await client.post(
        "/v1/runs", json={"results": results}, headers=keys.headers("agent", tenant=tenant)
    )


async def _erase(client: httpx.AsyncClient, keys: Keys, *, versions: list[str]) -> None:
    response = await client.post(
        "/v1/documents/refund-policy/erase",
        json={"reason": "customer request", "request_ref": "DSR-42", "versions": versions},
        headers=keys.headers("ingest"),
    )
    assert response.status_code == 200, response.text


async def _count(connection: AsyncConnection, table: str, *, tenant: str = "acme") -> int:
    """Rows of `tenant` in `table`, read as requests read them: scoped to the tenant first."""
    await connection.execute(
        text("SELECT set_config('app.tenant', :tenant, true)"), {"tenant": tenant}
    )
    # `table` is one of this module's literals, never input.
    statement = text(f"SELECT count(*) FROM {table} WHERE tenant = :tenant")
    return int((await connection.execute(statement, {"tenant": tenant})).scalar_one())


def _problems(body: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(e["index"], e["field"], e["problem"]) for e in body["errors"]]


async def test_run_issues_one_citation_per_result_in_result_order(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    chunks = policy_chunks()
    shuffled = [chunks[2], chunks[0], chunks[3], chunks[1]]

    body = await record_run(client, keys, results=results_for(shuffled))

    assert [c["chunk_id"] for c in body["citations"]] == ["c3", "c1", "c4", "c2"]
    assert [c["score"] for c in body["citations"]] == [0.9, 0.89, 0.88, 0.87]


async def test_run_answers_the_run_with_its_query_scope_and_tenant(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    body = await record_run(client, keys)

    assert body["run_id"].startswith("run_")
    assert body["tenant"] == "acme"
    assert body["query"] == "how long do refunds take?"
    assert body["scope"] == "HANDBOOK"
    assert datetime.fromisoformat(body["retrieved_at"]).tzinfo is not None


async def test_citation_carries_every_contract_field(client: httpx.AsyncClient, keys: Keys) -> None:
    await register_version(client, keys)
    chunk = policy_chunks()[0]

    body = await record_run(client, keys, results=results_for([chunk]))

    [citation] = body["citations"]
    assert set(citation) >= CITATION_FIELDS
    assert citation["citation_id"].startswith("cit_")
    assert citation | {"citation_id": None} == {
        "citation_id": None,
        "run_id": body["run_id"],
        "tenant": "acme",
        "document_id": "refund-policy",
        "document_version": "2026-11-03",
        "chunk_id": "c1",
        "score": 0.9,
        "branches": {"bm25": 11.2, "vector": 0.79, "rerank": 0.93},
        "retrieved_at": body["retrieved_at"],
        "locator": {"uri": "https://handbook/refunds", "page": 1, "section": "S1"},
        **_pinned(POLICY_TEXT, chunk["start"], chunk["end"]),
    }


async def test_every_citation_pins_the_hash_and_offsets_of_its_characters(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    chunks = policy_chunks()

    body = await record_run(client, keys)

    for chunk, citation in zip(chunks, body["citations"], strict=True):
        assert {k: citation[k] for k in ("span", "span_utf8", "span_utf16", "span_sha256")} == (
            _pinned(POLICY_TEXT, chunk["start"], chunk["end"])
        )
    # The policy text is where code points, UTF-8 bytes and UTF-16 units all part ways.
    last = body["citations"][-1]
    assert len({last["span"]["end"], last["span_utf8"]["end"], last["span_utf16"]["end"]}) == 3


UNICODE_CASES = {
    "after a ZWJ family emoji": (f"We are {FAMILY}Family rules apply.", FAMILY, "Family rules"),
    "inside a ZWJ family emoji": (f"We are {FAMILY} together.", "\u200d\U0001f469", " together"),
    "astral plane characters": (
        "Music \U0001d11e and math \U0001d4b3 and \U0001f600 faces \U00020000 too.",
        "\U0001d11e",
        "\U00020000 too.",
    ),
    "combining marks": ("Cafe\u0301 re\u0301sume\u0301 nai\u0308ve.", "re\u0301", "nai\u0308ve"),
    "CJK": ("返金は三十日以内に行われます。交換には領収書が必要です。", "三十日", "交換"),
    "flags and skin tones": (
        "Teams \U0001f1ef\U0001f1f5 and \U0001f44d\U0001f3fd won.",
        "\U0001f1f5",
        "\U0001f3fd won",
    ),
    "text ending in an emoji": ("Receipt needed \U0001f9fe", "needed", "\U0001f9fe"),
}


@pytest.mark.parametrize("case", list(UNICODE_CASES), ids=list(UNICODE_CASES))
async def test_offsets_in_utf8_and_utf16_agree_with_the_code_points(
    client: httpx.AsyncClient, keys: Keys, case: str
) -> None:
    body_text, first_from, second_from = UNICODE_CASES[case]
    first = body_text.index(first_from)
    second = body_text.index(second_from)
    chunks: list[dict[str, Any]] = [
        {"chunk_id": "head", "start": 0, "end": first},
        {"chunk_id": "middle", "start": first, "end": second},
        {"chunk_id": "tail", "start": second, "end": len(body_text)},
        {"chunk_id": "whole", "start": 0, "end": len(body_text)},
    ]
    await register_version(client, keys, text=body_text, chunks=chunks)

    body = await record_run(client, keys, results=results_for(chunks))

    for chunk, citation in zip(chunks, body["citations"], strict=True):
        expected = _pinned(body_text, chunk["start"], chunk["end"])
        assert {k: citation[k] for k in expected} == expected, chunk["chunk_id"]


async def test_chunk_starting_right_after_a_zwj_family_has_the_family_s_full_width_before_it(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    body_text = f"{FAMILY}Refunds"
    chunks = [{"chunk_id": "after", "start": 7, "end": 14}]
    await register_version(client, keys, text=body_text, chunks=chunks)

    body = await record_run(client, keys, results=results_for(chunks))

    [citation] = body["citations"]
    # Four astral emoji (4 bytes, 2 units each) joined by three ZWJs (3 bytes, 1 unit each).
    assert citation["span_utf8"] == {"start": 25, "end": 32}
    assert citation["span_utf16"] == {"start": 11, "end": 18}
    assert citation["span_sha256"] == hashlib.sha256(b"Refunds").hexdigest()


async def test_locator_prefers_the_chunk_uri_over_the_version_uri(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [
        {"chunk_id": "own", "start": 0, "end": 7, "uri": "https://handbook/refunds#own"},
        {"chunk_id": "inherited", "start": 7, "end": 20, "section": "Scope"},
    ]
    await register_version(client, keys, chunks=chunks)

    body = await record_run(client, keys, results=results_for(chunks))

    assert [c["locator"] for c in body["citations"]] == [
        {"uri": "https://handbook/refunds#own", "page": None, "section": None},
        {"uri": "https://handbook/refunds", "page": None, "section": "Scope"},
    ]


async def test_locator_uri_is_null_when_neither_chunk_nor_version_has_one(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": 7}]
    await register_version(client, keys, chunks=chunks, uri=None)

    body = await record_run(client, keys, results=results_for(chunks))

    assert body["citations"][0]["locator"] == {"uri": None, "page": None, "section": None}


async def test_locators_that_json_escapes_are_stored_and_read_back_as_issued(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    # The run's rows reach the server as one JSON text: quotes, backslashes, controls and astral
    # characters must come back from the rows exactly as issued.
    awkward = 'Scope "A"\\B\n\tC\u00e9 \U0001f9fe/\u200d'
    chunks = [
        {"chunk_id": 'c"1', "start": 0, "end": 7, "uri": f"https://h/{awkward}"},
        {"chunk_id": "c\\2", "start": 7, "end": 20, "section": awkward},
    ]
    await register_version(client, keys, chunks=chunks)

    issued = await record_run(client, keys, results=results_for(chunks))
    read = await client.get(f"/v1/runs/{issued['run_id']}", headers=keys.headers("agent"))

    assert issued["citations"][0]["locator"]["uri"] == f"https://h/{awkward}"
    assert issued["citations"][1]["locator"]["section"] == awkward
    assert read.json() == issued


async def test_the_same_chunk_retrieved_twice_gets_two_citations(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    chunk = policy_chunks()[0]

    body = await record_run(client, keys, results=results_for([chunk, chunk]))

    first, second = body["citations"]
    assert first["citation_id"] != second["citation_id"]
    assert first["chunk_id"] == second["chunk_id"] == "c1"


async def test_result_without_score_or_branches_is_cited_with_none(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    chunk = policy_chunks()[0]
    result = {
        "document_id": "refund-policy",
        "version": "2026-11-03",
        "chunk_id": "c1",
        "start": chunk["start"],
        "end": chunk["end"],
    }

    body = await record_run(client, keys, results=[result])

    assert body["citations"][0]["score"] is None
    assert body["citations"][0]["branches"] == {}


async def test_integer_score_is_a_valid_number(client: httpx.AsyncClient, keys: Keys) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    body = await record_run(client, keys, results=[result | {"score": 1, "branches": {"bm25": 3}}])

    assert body["citations"][0]["score"] == 1.0
    assert body["citations"][0]["branches"] == {"bm25": 3.0}


async def test_scores_and_branches_are_stored_exactly_as_given(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    chunks = results_for(policy_chunks()[:1])
    # Shortest round-trip forms, exponents, the smallest subnormal and the largest float.
    scores = [0.1 + 0.2, 1e-05, 5e-324, 1.7976931348623157e308, 123456789.98765433]
    results = [
        chunks[0] | {"score": score, "branches": {"bm25": score, "vector": -score / 3}}
        for score in scores
    ]

    body = await record_run(client, keys, results=results)
    read = await client.get(f"/v1/runs/{body['run_id']}", headers=keys.headers("agent"))

    for citations in (body["citations"], read.json()["citations"]):
        assert [c["score"] for c in citations] == scores
        assert [c["branches"] for c in citations] == [
            {"bm25": score, "vector": -score / 3} for score in scores
        ]


async def test_run_with_zero_results_is_recorded_with_no_citations(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    body = await record_run(client, keys, results=[])

    assert body["citations"] == []
    assert await _count(connection, "runs") == 1
    assert await _count(connection, "citations") == 0
    read = await client.get(f"/v1/runs/{body['run_id']}", headers=keys.headers("agent"))
    assert read.json() == body


async def test_run_writes_one_citation_row_per_result(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)

    body = await record_run(client, keys)

    assert await _count(connection, "runs") == 1
    rows = await connection.execute(
        text("SELECT citation_id FROM citations WHERE run_id = :run ORDER BY ordinal"),
        {"run": body["run_id"]},
    )
    assert list(rows.scalars()) == [c["citation_id"] for c in body["citations"]]


@pytest.mark.parametrize("field", ["version", "start", "end"])
async def test_result_missing_a_required_field_is_configuration_error(
    client: httpx.AsyncClient, keys: Keys, field: str
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])
    del result[field]

    response = await _post_run(client, keys, [result])

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [{"index": 0, "field": field, "problem": "missing"}]
    assert body["detail"] == "1 of 1 retrieved chunks cannot be pinned; no citation was issued"
    assert body["title"] == "Configuration error"


@pytest.mark.parametrize("field", ["version", "start", "end"])
async def test_result_with_a_null_required_field_is_configuration_error(
    client: httpx.AsyncClient, keys: Keys, field: str
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result | {field: None}])

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [{"index": 0, "field": field, "problem": "missing"}]


async def test_result_missing_version_start_and_end_lists_each(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    result = {"document_id": "refund-policy", "chunk_id": "c1", "score": 0.5}

    response = await _post_run(client, keys, [result])

    body = _assert_problem(response, 422, "configuration_error")
    assert _problems(body) == [
        (0, "version", "missing"),
        (0, "start", "missing"),
        (0, "end", "missing"),
    ]


async def test_result_missing_its_span_is_still_checked_against_the_registry(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    result = {"document_id": "refund-policy", "version": "2026-11-03", "chunk_id": "c99"}

    response = await _post_run(client, keys, [result])

    body = _assert_problem(response, 422, "configuration_error")
    assert _problems(body) == [
        (0, "start", "missing"),
        (0, "end", "missing"),
        (0, "chunk_id", "unknown_chunk"),
    ]


async def test_result_naming_an_unregistered_version_is_unknown_version(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1], version="1999-01-01")

    response = await _post_run(client, keys, [result])

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [{"index": 0, "field": "version", "problem": "unknown_version"}]


async def test_result_naming_an_unregistered_document_is_unknown_version(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1], document_id="no-such-document")

    response = await _post_run(client, keys, [result])

    body = _assert_problem(response, 422, "configuration_error")
    assert _problems(body) == [(0, "version", "unknown_version")]


async def test_another_tenants_version_is_unknown_exactly_like_an_unregistered_one(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, tenant="globex", document_id="globex-policy")
    [theirs] = results_for(policy_chunks()[:1], document_id="globex-policy")
    [missing] = results_for(policy_chunks()[:1], document_id="never-registered")

    response = await _post_run(client, keys, [theirs, missing])

    body = _assert_problem(response, 422, "configuration_error")
    assert _problems(body) == [(0, "version", "unknown_version"), (1, "version", "unknown_version")]


async def test_result_naming_an_unregistered_chunk_is_unknown_chunk(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result | {"chunk_id": "c99"}])

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [{"index": 0, "field": "chunk_id", "problem": "unknown_chunk"}]


async def test_chunk_of_another_version_is_unknown_in_this_one(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(
        client, keys, version="v1", chunks=[{"chunk_id": "a", "start": 0, "end": 7}]
    )
    await register_version(
        client, keys, version="v2", chunks=[{"chunk_id": "b", "start": 0, "end": 7}]
    )
    result = {
        "document_id": "refund-policy",
        "version": "v2",
        "chunk_id": "a",
        "start": 0,
        "end": 7,
    }

    response = await _post_run(client, keys, [result])

    body = _assert_problem(response, 422, "configuration_error")
    assert _problems(body) == [(0, "chunk_id", "unknown_chunk")]


async def test_result_whose_start_differs_from_the_registry_is_span_mismatch(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[1:2])

    response = await _post_run(client, keys, [result | {"start": result["start"] + 1}])

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [{"index": 0, "field": "start", "problem": "span_mismatch"}]


async def test_result_whose_end_differs_from_the_registry_is_span_mismatch(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[1:2])

    response = await _post_run(client, keys, [result | {"end": result["end"] - 1}])

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [{"index": 0, "field": "end", "problem": "span_mismatch"}]


async def test_result_whose_whole_span_differs_lists_start_and_end(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[1:2])

    response = await _post_run(client, keys, [result | {"start": 0, "end": 3}])

    body = _assert_problem(response, 422, "configuration_error")
    assert _problems(body) == [(0, "start", "span_mismatch"), (0, "end", "span_mismatch")]


@pytest.mark.parametrize(("start", "end"), [(40, 35), (35, 35), (2**70, 35)])
async def test_result_whose_span_is_reversed_or_empty_is_span_mismatch(
    client: httpx.AsyncClient, keys: Keys, start: int, end: int
) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": 35}]
    await register_version(client, keys, chunks=chunks)
    [result] = results_for(chunks)

    response = await _post_run(client, keys, [result | {"start": start, "end": end}])

    body = _assert_problem(response, 422, "configuration_error")
    assert _problems(body) == [(0, "start", "span_mismatch")]


async def test_result_naming_an_erased_version_is_erased_version(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    await _erase(client, keys, versions=["2026-11-03"])
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result])

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [{"index": 0, "field": "version", "problem": "erased_version"}]


async def test_erasing_one_version_leaves_the_others_citable(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    await register_version(client, keys, version="v2")
    await _erase(client, keys, versions=["v1"])
    [old] = results_for(policy_chunks()[:1], version="v1")
    [new] = results_for(policy_chunks()[:1], version="v2")

    rejected = await _post_run(client, keys, [new, old])
    accepted = await _post_run(client, keys, [new])

    assert _problems(_assert_problem(rejected, 422, "configuration_error")) == [
        (1, "version", "erased_version")
    ]
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["citations"][0]["document_version"] == "v2"


async def test_several_bad_results_are_listed_by_zero_based_index(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    await register_version(client, keys, version="gone")
    await _erase(client, keys, versions=["gone"])
    good = results_for(policy_chunks(), version="v1")
    results = [
        good[0],
        {k: v for k, v in good[1].items() if k != "version"},
        good[2],
        good[3] | {"chunk_id": "c99"},
        good[1] | {"end": good[1]["end"] + 1},
        good[0] | {"version": "gone"},
        good[0] | {"version": "never"},
    ]

    response = await _post_run(client, keys, results)

    body = _assert_problem(response, 422, "configuration_error")
    assert body["errors"] == [
        {"index": 1, "field": "version", "problem": "missing"},
        {"index": 3, "field": "chunk_id", "problem": "unknown_chunk"},
        {"index": 4, "field": "end", "problem": "span_mismatch"},
        {"index": 5, "field": "version", "problem": "erased_version"},
        {"index": 6, "field": "version", "problem": "unknown_version"},
    ]
    assert body["detail"] == "5 of 7 retrieved chunks cannot be pinned; no citation was issued"


async def test_configuration_error_writes_no_run_and_no_citation(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)
    results = results_for(policy_chunks())
    results[2] |= {"chunk_id": "c99"}

    response = await _post_run(client, keys, results)

    _assert_problem(response, 422, "configuration_error")
    assert "run_id" not in response.json()
    assert await _count(connection, "runs") == 0
    assert await _count(connection, "citations") == 0
    # The same count sees a run once one is recorded.
    await record_run(client, keys)
    assert await _count(connection, "runs") == 1
    assert await _count(connection, "citations") == len(results)


async def test_configuration_error_never_quotes_the_text(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result | {"end": 3}])

    assert response.status_code == 422
    assert "Refunds" not in response.text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("start", "0"),
        ("start", True),
        ("start", 1.5),
        ("end", [35]),
        ("version", 20261103),
        ("chunk_id", None),
        ("document_id", {"id": "refund-policy"}),
        ("score", "0.9"),
        ("score", True),
        ("branches", ["bm25"]),
        ("branches", {"bm25": "high"}),
    ],
)
async def test_result_with_a_wrong_json_type_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, field: str, value: Any
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result | {field: value}])

    body = _assert_problem(response, 422, "validation_error")
    assert [e["loc"][:4] for e in body["errors"]] == [["body", "results", 0, field]]


async def test_wrong_json_type_is_validation_error_even_beside_a_missing_version(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])
    missing_version = {k: v for k, v in result.items() if k != "version"}

    response = await _post_run(client, keys, [missing_version, result | {"start": "0"}])

    body = _assert_problem(response, 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [["body", "results", 1, "start"]]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_result_with_a_non_finite_score_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, literal: str
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])
    content = json.dumps({"results": [result | {"score": 0.5}]}).replace("0.5", literal)

    response = await client.post(
        "/v1/runs",
        content=content.encode(),
        headers=keys.headers("agent") | {"content-type": "application/json"},
    )

    body = _assert_problem(response, 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [["body", "results", 0, "score"]]


async def test_result_with_an_unknown_field_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result | {"text": "made-up text"}])

    body = _assert_problem(response, 422, "validation_error")
    assert [e["type"] for e in body["errors"]] == ["extra_forbidden"]


async def test_result_with_a_negative_offset_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result | {"start": -1}])

    _assert_problem(response, 422, "validation_error")


async def test_results_missing_document_id_or_chunk_id_are_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])
    no_document = {k: v for k, v in result.items() if k != "document_id"}
    no_chunk = {k: v for k, v in result.items() if k != "chunk_id"}

    response = await _post_run(client, keys, [no_document, no_chunk])

    body = _assert_problem(response, 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [
        ["body", "results", 0, "document_id"],
        ["body", "results", 1, "chunk_id"],
    ]


async def test_result_naming_a_nul_character_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)
    [result] = results_for(policy_chunks()[:1])

    response = await _post_run(client, keys, [result | {"version": "2026-11-03\x00"}])

    _assert_problem(response, 422, "validation_error")
    assert await _count(connection, "runs") == 0


@pytest.fixture
def small_app(settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]) -> Any:
    assert settings.database_url is not None
    app = create_app(Settings(database_url=settings.database_url, max_results_per_run=2))
    app.state.sessionmaker = sessionmaker
    return app


@pytest.fixture
async def small_client(small_app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=small_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://grounding.test") as client:
        yield client


async def test_run_over_the_results_limit_is_payload_too_large(
    small_client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(small_client, keys)

    response = await _post_run(small_client, keys, results_for(policy_chunks()[:3]))

    body = _assert_problem(response, 413, "payload_too_large")
    assert body["limit"] == 2
    assert await _count(connection, "runs") == 0
    accepted = await _post_run(small_client, keys, results_for(policy_chunks()[:2]))
    assert accepted.status_code == 201, accepted.text
    assert await _count(connection, "runs") == 1


async def test_get_run_returns_what_was_issued(client: httpx.AsyncClient, keys: Keys) -> None:
    await register_version(client, keys)
    issued = await record_run(client, keys)

    for scope in ("agent", "support", "admin"):
        response = await client.get(f"/v1/runs/{issued['run_id']}", headers=keys.headers(scope))
        assert response.status_code == 200, (scope, response.text)
        assert response.json() == issued


async def test_get_citation_returns_what_was_issued(client: httpx.AsyncClient, keys: Keys) -> None:
    await register_version(client, keys)
    issued = await record_run(client, keys)

    for citation in issued["citations"]:
        response = await client.get(
            f"/v1/citations/{citation['citation_id']}", headers=keys.headers("support")
        )
        assert response.status_code == 200, response.text
        assert response.json() == citation


async def test_unknown_run_is_not_found(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.get("/v1/runs/run_nonexistent", headers=keys.headers("agent"))

    _assert_problem(response, 404, "not_found")


async def test_another_tenants_run_is_not_found_exactly_like_a_missing_one(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, tenant="globex")
    theirs = await record_run(client, keys, tenant="globex")

    response = await client.get(f"/v1/runs/{theirs['run_id']}", headers=keys.headers("agent"))
    missing = await client.get("/v1/runs/run_nonexistent", headers=keys.headers("agent"))

    _assert_problem(response, 404, "not_found")
    assert response.json() == missing.json()


async def test_another_tenants_citation_is_not_found_exactly_like_a_missing_one(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, tenant="globex")
    theirs = await record_run(client, keys, tenant="globex")
    citation_id = theirs["citations"][0]["citation_id"]

    response = await client.get(f"/v1/citations/{citation_id}", headers=keys.headers("support"))
    missing = await client.get("/v1/citations/cit_nonexistent", headers=keys.headers("support"))

    _assert_problem(response, 404, "not_found")
    assert response.json() == missing.json()
    own = await client.get(
        f"/v1/citations/{citation_id}", headers=keys.headers("support", tenant="globex")
    )
    assert own.status_code == 200


async def test_runs_of_one_tenant_cite_only_that_tenants_versions(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, tenant="globex")
    await register_version(client, keys, title="Acme refunds")

    acme = await record_run(client, keys)
    globex = await record_run(client, keys, tenant="globex")

    assert {c["tenant"] for c in acme["citations"]} == {"acme"}
    assert {c["tenant"] for c in globex["citations"]} == {"globex"}


async def test_a_run_is_written_in_one_statement_with_its_citations_and_audit_entry(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    text_, chunks = many_chunks(60)
    await register_version(
        client, keys, document_id="rules", version="v1", text=text_, chunks=chunks
    )

    async def record(count: int) -> list[str]:
        results = results_for(chunks[:count], document_id="rules", version="v1")
        async with statements_sent(connection) as statements:
            response = await _post_run(client, keys, results)
        assert response.status_code == 201, response.text
        assert len(response.json()["citations"]) == count
        return [re.sub(r"sa_savepoint_\d+", "sa_savepoint", s) for s in statements]

    one = await record(1)
    assert one == await record(60)
    [written] = [s for s in one if "INSERT INTO runs" in s]
    assert "INSERT INTO citations" in written
    assert "INSERT INTO audit_entries" in written
    assert not [s for s in one if s is not written and "INSERT" in s]
