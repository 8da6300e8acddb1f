"""Limits: every count, length and depth a request can grow is bounded, and answered with a
problem (413 `payload_too_large` for counts over a setting, 422 `validation_error` for lengths
and depth) before the work grows with it. The body size, text length, chunks and resolve ids
are tested with their domains (test_errors, test_documents, test_citations); the rest are here.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.errors import MAX_LISTED_ERRORS
from app.main import create_app
from app.middleware import nests_deeper
from tests.factories import (
    Keys,
    claim,
    many_chunks,
    policy_chunks,
    record_run,
    register_version,
    results_for,
    submit_answer,
)

PROBLEM_JSON = "application/problem+json"
SMALL = {
    "max_results_per_run": 3,
    "max_claims_per_answer": 2,
    "max_citations_per_answer": 2,
    "max_resolve_ids": 2,
    "max_json_depth": 8,
}


def _problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    assert body["status"] == status
    return body


@pytest.fixture
async def small(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app whose count limits are a few items and whose depth limit is 8."""
    app: FastAPI = create_app(settings.model_copy(update=SMALL))
    app.state.sessionmaker = sessionmaker
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://grounding.test") as client:
        yield client


def test_limits_default_to_the_contract() -> None:
    defaults = Settings()
    assert defaults.max_body_bytes == 16 * 1024 * 1024
    assert defaults.max_text_chars == 8 * 1024 * 1024
    assert defaults.max_chunks_per_version == 10_000
    assert defaults.max_results_per_run == 1000
    assert defaults.max_claims_per_answer == 1000
    assert defaults.max_citations_per_answer == 1000
    assert defaults.max_resolve_ids == 1000
    assert defaults.max_json_depth == 32


# --- counts over a setting: 413 -----------------------------------------------------------


async def test_results_over_the_limit_are_payload_too_large(
    small: httpx.AsyncClient, keys: Keys
) -> None:
    text, chunks = many_chunks(4)
    await register_version(small, keys, text=text, chunks=chunks[:3])
    at_limit = await record_run(small, keys, results=results_for(chunks[:3]))
    assert len(at_limit["citations"]) == 3

    response = await small.post(
        "/v1/runs",
        json={"results": results_for(chunks[:3] * 2)[:4]},
        headers=keys.headers("agent"),
    )

    body = _problem(response, 413, "payload_too_large")
    assert body["limit"] == 3
    assert "results per run" in body["detail"]


async def test_claims_and_citations_over_their_limits_are_payload_too_large(
    small: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(small, keys)
    run = await record_run(small, keys, results=results_for(policy_chunks()[:3]))
    issued = run["citations"][:2]
    ids = [c["citation_id"] for c in issued]
    grounded = await submit_answer(
        small,
        keys,
        run["run_id"],
        claims=[claim("a", ids[0]), claim("b", ids[1])],
        citations=issued,
    )
    assert grounded["outcome"] == "grounded"

    too_many_claims = await small.post(
        f"/v1/runs/{run['run_id']}/answers",
        json={"claims": [claim("a", ids[0])] * 3, "citations": issued},
        headers=keys.headers("agent"),
    )
    too_many_citations = await small.post(
        f"/v1/runs/{run['run_id']}/answers",
        json={"claims": [claim("a", ids[0])], "citations": run["citations"][:3]},
        headers=keys.headers("agent"),
    )

    assert _problem(too_many_claims, 413, "payload_too_large")["limit"] == 2
    assert "claims per answer" in too_many_claims.json()["detail"]
    assert _problem(too_many_citations, 413, "payload_too_large")["limit"] == 2
    assert "citations per answer" in too_many_citations.json()["detail"]


async def test_memory_citation_ids_over_the_resolve_limit_are_payload_too_large(
    small: httpx.AsyncClient, keys: Keys
) -> None:
    response = await small.post(
        "/v1/memory",
        json={"text": "noted", "citation_ids": ["cit_a", "cit_b", "cit_c"]},
        headers=keys.headers("agent"),
    )

    assert _problem(response, 413, "payload_too_large")["limit"] == 2


@pytest.mark.parametrize(
    ("path", "scope", "body"),
    [
        ("/v1/runs", "agent", {"results": [1] * 200_000}),
        ("/v1/runs/run_x/answers", "agent", {"claims": [1] * 200_000, "citations": []}),
        ("/v1/runs/run_x/answers", "agent", {"claims": [], "citations": [1] * 200_000}),
        ("/v1/citations/resolve", "support", {"citation_ids": [1] * 200_000}),
        ("/v1/memory", "agent", {"text": "t", "citation_ids": [1] * 200_000}),
        (
            "/v1/documents/d/versions",
            "ingest",
            {"version": "v", "text": "t", "chunks": [1] * 200_000},
        ),
    ],
)
async def test_a_long_list_of_wrong_values_is_refused_by_its_count_before_validation(
    client: httpx.AsyncClient, keys: Keys, path: str, scope: str, body: dict[str, Any]
) -> None:
    # Validated first, each wrong item would be one error: 200,000 of them, in a huge 422.
    began = time.monotonic()
    response = await client.post(path, json=body, headers=keys.headers(scope))

    _problem(response, 413, "payload_too_large")
    assert len(response.content) < 1000
    assert time.monotonic() - began < 5


# --- lengths and nested lists: 422 ----------------------------------------------------------


async def test_validation_lists_the_first_errors_and_counts_them_all(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        "/v1/runs", json={"results": [1] * 600}, headers=keys.headers("agent")
    )

    body = _problem(response, 422, "validation_error")
    assert body["error_count"] == 600
    assert len(body["errors"]) == MAX_LISTED_ERRORS
    assert body["errors"][0]["loc"] == ["body", "results", 0]


async def test_a_few_validation_errors_are_all_listed(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        "/v1/runs", json={"results": [1, 2, 3]}, headers=keys.headers("agent")
    )

    body = _problem(response, 422, "validation_error")
    assert body["error_count"] == 3
    assert [e["loc"] for e in body["errors"]] == [["body", "results", i] for i in range(3)]


def _answer(ids: list[str], **claim_fields: Any) -> dict[str, Any]:
    return {
        "claims": [{"text": "Refunds take a month.", "citation_ids": ids[:1]} | claim_fields],
        "citations": [{"citation_id": ids[0], "document_id": "d", "document_version": "v"}],
    }


LONG_STRINGS: list[tuple[str, str, Any, list[Any]]] = [
    # (path, scope, body, where the error is)
    ("/v1/runs", "agent", {"query": "q" * 65_537, "results": []}, ["body", "query"]),
    ("/v1/runs", "agent", {"scope": "s" * 1025, "results": []}, ["body", "scope"]),
    (
        "/v1/runs/run_x/answers",
        "agent",
        {"claims": [{"text": "t" * 65_537, "citation_ids": ["c"]}], "citations": []},
        ["body", "claims", 0, "text"],
    ),
    (
        "/v1/runs/run_x/answers",
        "agent",
        {
            "claims": [
                {
                    "text": "t",
                    "citation_ids": ["c"],
                    "quotes": [{"citation_id": "c", "text": "q" * 65_537}],
                }
            ],
            "citations": [],
        },
        ["body", "claims", 0, "quotes", 0, "text"],
    ),
    (
        "/v1/runs/run_x/answers",
        "agent",
        {"claims": [{"text": "t", "citation_ids": ["c"] * 1001}], "citations": []},
        ["body", "claims", 0, "citation_ids"],
    ),
    (
        "/v1/runs/run_x/answers",
        "agent",
        {
            "claims": [],
            "citations": [
                {
                    "citation_id": "c",
                    "document_id": "d",
                    "document_version": "v",
                    "tenant": "t" * 257,
                }
            ],
        },
        ["body", "citations", 0, "tenant"],
    ),
    (
        "/v1/runs/run_x/answers",
        "agent",
        {
            "claims": [],
            "citations": [
                {
                    "citation_id": "c",
                    "document_id": "d",
                    "document_version": "v",
                    "locator": {"section": "s" * 4097},
                }
            ],
        },
        ["body", "citations", 0, "locator", "section"],
    ),
    (
        "/v1/runs",
        "agent",
        {
            "results": [
                {"document_id": "d", "chunk_id": "c", "branches": {f"b{i}": 1.0 for i in range(65)}}
            ]
        },
        ["body", "results", 0, "branches"],
    ),
    (
        "/v1/runs",
        "agent",
        {"results": [{"document_id": "d", "chunk_id": "c", "branches": {"b" * 257: 1.0}}]},
        ["body", "results", 0, "branches", "b" * 257, "[key]"],
    ),
    ("/v1/memory", "agent", {"text": "m" * 1_048_577, "citation_ids": []}, ["body", "text"]),
    (
        "/v1/documents/d/erase",
        "ingest",
        {"reason": "r" * 4097, "request_ref": "DSR-1"},
        ["body", "reason"],
    ),
    (
        "/v1/documents/d/erase",
        "ingest",
        {"reason": "r", "request_ref": "x" * 257},
        ["body", "request_ref"],
    ),
    (
        "/v1/documents/d/erase",
        "ingest",
        {"reason": "r", "request_ref": "DSR-1", "versions": [f"v{i}" for i in range(1001)]},
        ["body", "versions"],
    ),
]


@pytest.mark.parametrize(("path", "scope", "body", "loc"), LONG_STRINGS)
async def test_strings_and_nested_lists_over_their_bounds_are_validation_errors(
    client: httpx.AsyncClient, keys: Keys, path: str, scope: str, body: Any, loc: list[Any]
) -> None:
    response = await client.post(path, json=body, headers=keys.headers(scope))

    problem = _problem(response, 422, "validation_error")
    assert loc in [e["loc"][: len(loc)] for e in problem["errors"]], problem["errors"]


async def test_strings_at_their_bounds_are_accepted(client: httpx.AsyncClient, keys: Keys) -> None:
    await register_version(client, keys)
    run = await client.post(
        "/v1/runs",
        json={"query": "q" * 65_536, "scope": "s" * 1024, "results": results_for([])},
        headers=keys.headers("agent"),
    )
    assert run.status_code == 201, run.text
    cited = await record_run(client, keys)
    issued = cited["citations"][0]

    answer = await submit_answer(
        client,
        keys,
        cited["run_id"],
        claims=[claim("t" * 65_536, issued["citation_id"])],
        citations=[issued],
    )
    memory = await client.post(
        "/v1/memory",
        json={"text": "m" * 1_048_576, "citation_ids": [issued["citation_id"]]},
        headers=keys.headers("agent"),
    )

    assert answer["outcome"] == "grounded"
    assert memory.status_code == 201, memory.text


async def test_wrong_ids_in_many_claims_are_one_error_a_claim(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    # 1000 claims of 1000 wrong ids each would otherwise be a million errors.
    body = {"claims": [{"text": "t", "citation_ids": [1] * 1000}] * 1000, "citations": []}

    response = await client.post("/v1/runs/run_x/answers", json=body, headers=keys.headers("agent"))

    problem = _problem(response, 422, "validation_error")
    assert problem["error_count"] == 1000


# --- nesting depth: 422 before anything parses the body -----------------------------------


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


async def test_a_body_deeper_than_the_limit_is_refused_before_it_is_parsed(
    small: httpx.AsyncClient, keys: Keys
) -> None:
    deep = {"results": [], "query": "q", "scope": _nested(8)}  # 9 levels with the body itself

    response = await small.post("/v1/runs", json=deep, headers=keys.headers("agent"))
    # Not even the key is looked at: the body is refused as it arrives.
    unauthenticated = await small.post("/v1/runs", json=deep)

    body = _problem(response, 422, "validation_error")
    assert body["limit"] == 8
    assert "8 levels" in body["detail"]
    assert _problem(unauthenticated, 422, "validation_error")["limit"] == 8


async def test_a_body_at_the_depth_limit_reaches_validation(
    small: httpx.AsyncClient, keys: Keys
) -> None:
    at_limit = {"results": [], "query": "q", "scope": _nested(7)}

    response = await small.post("/v1/runs", json=at_limit, headers=keys.headers("agent"))

    body = _problem(response, 422, "validation_error")
    assert "limit" not in body
    assert body["errors"][0]["loc"] == ["body", "scope"]


async def test_brackets_inside_strings_are_not_nesting(
    small: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(small, keys)
    run = await small.post(
        "/v1/runs",
        json={"query": '[[[[[[[[[[{{{{{{{{\\"]]', "results": []},
        headers=keys.headers("agent"),
    )

    assert run.status_code == 201, run.text
    assert run.json()["query"] == '[[[[[[[[[[{{{{{{{{\\"]]'


async def test_the_default_depth_limit_refuses_a_deep_body(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    content = b'{"results": [], "scope": ' + b"[" * 5000 + b"]" * 5000 + b"}"

    response = await client.post(
        "/v1/runs",
        content=content,
        headers=keys.headers("agent") | {"content-type": "application/json"},
    )

    assert _problem(response, 422, "validation_error")["limit"] == 32


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet='[]{}"\\ab'), inner, max_size=4)
    ),
    max_leaves=40,
)


@given(value=JSON_VALUES, limit=st.integers(min_value=1, max_value=12), ascii_only=st.booleans())
def test_nesting_scan_agrees_with_the_parsed_depth(
    value: Any, limit: int, ascii_only: bool
) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode()

    assert nests_deeper(body, limit) == (_depth(value) > limit)


def _fastest_scan(body: bytes) -> float:
    timings = []
    for _ in range(3):
        began = time.perf_counter()
        nests_deeper(body, 32)
        timings.append(time.perf_counter() - began)
    return min(timings)


# Bodies of `n` units each: the largest the body limit allows is 16 MB.
BODIES: dict[str, Callable[[int], bytes]] = {
    "deep": lambda n: b"[" * n + b"]" * n,
    "wide": lambda n: b"[]" * n,
    "wide-and-deep": lambda n: (b"[" * 32 + b"]" * 32) * (n // 32),
    "escapes": lambda n: b'"' + b'\\"' * n + b'"',
}


@pytest.mark.parametrize("shape", BODIES)
def test_nesting_scan_grows_linearly_with_the_body(shape: str) -> None:
    # Against the same scan of a body an eighth the size, measured in this process: a scan
    # quadratic in the body would take 64 times as long, a linear one 8 (give or take noise).
    small, large = (BODIES[shape](n) for n in (1_000_000, 8_000_000))
    assert _fastest_scan(large) < 24 * _fastest_scan(small)


# --- the largest rejection the limits allow ---------------------------------------------------


async def test_the_largest_rejection_the_limits_allow_is_answered_and_recorded(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    # A thousand citations with every pinned field changed and a thousand claims naming ids the
    # answer does not carry: each violation that lists the run's thousand ids is one per
    # citation or claim, so the rejection stays tens of megabytes, not hundreds (and no 500).
    text, chunks = many_chunks(1000)
    await register_version(client, keys, text=text, chunks=chunks)
    run = await record_run(client, keys, results=results_for(chunks))
    issued = [c["citation_id"] for c in run["citations"]]
    changed = {
        "run_id": "run_elsewhere",
        "chunk_id": "c_elsewhere",
        "span": {"start": 0, "end": 1},
        "span_utf8": {"start": 0, "end": 1},
        "span_utf16": {"start": 0, "end": 1},
        "score": 0.123456789,
        "branches": {"elsewhere": 1.0},
        "retrieved_at": "2020-01-01T00:00:00Z",
        "locator": {"uri": "https://elsewhere"},
        "span_sha256": "0" * 64,
    }
    answer = {
        "claims": [claim(f"Claim {i}.", f"cit_missing_{i}") for i in range(1000)],
        "citations": [c | changed for c in run["citations"]],
    }

    response = await client.post(
        f"/v1/runs/{run['run_id']}/answers", json=answer, headers=keys.headers("agent")
    )

    body = _problem(response, 422, "ungrounded_citation")
    violations = body["violations"]
    assert len(violations) == 1000 * len(changed) + 1000
    of_first = [v for v in violations if v.get("citation") == 0]
    assert [v["field"] for v in of_first] == list(changed)
    assert of_first[0]["missing"] == [issued[0]]
    assert of_first[0]["available"] == issued
    assert all("available" not in v and "missing" not in v for v in of_first[1:])
    assert violations[-1]["missing"] == ["cit_missing_999"]
    recorded = await client.get(
        f"/v1/answers/{body['verification_id']}", headers=keys.headers("support")
    )
    assert recorded.status_code == 200, recorded.text
    assert recorded.json()["outcome"] == "rejected"
    assert recorded.json()["violations"] == violations
