"""The corpus registry over HTTP: registering versions, conflicts, chunk validation, reading."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.main import create_app
from tests.factories import (
    POLICY_TEXT,
    Keys,
    policy_chunks,
    record_run,
    register_version,
    results_for,
)

PROBLEM_JSON = "application/problem+json"


def _body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "version": "2026-11-03",
        "text": POLICY_TEXT,
        "uri": "https://handbook/refunds",
        "title": "Refunds",
        "chunks": policy_chunks(),
    }
    return body | overrides


async def _register(
    client: httpx.AsyncClient,
    keys: Keys,
    body: dict[str, Any],
    *,
    document_id: str = "refund-policy",
) -> httpx.Response:
    return await client.post(
        f"/v1/documents/{document_id}/versions", json=body, headers=keys.headers("ingest")
    )


def _assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == f"urn:grounding:problem:{code}"
    assert isinstance(body["title"], str)
    assert isinstance(body["detail"], str)
    return body


async def test_first_registration_is_created_with_its_metadata(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await _register(client, keys, _body())

    assert response.status_code == 201, response.text
    body = response.json()
    assert body["tenant"] == "acme"
    assert body["document_id"] == "refund-policy"
    assert body["version"] == "2026-11-03"
    assert body["sha256"] == hashlib.sha256(POLICY_TEXT.encode("utf-8")).hexdigest()
    assert body["uri"] == "https://handbook/refunds"
    assert body["title"] == "Refunds"
    assert body["chunk_count"] == len(policy_chunks())
    assert body["erased_at"] is None
    assert body["created_at"]


async def test_registration_never_returns_the_text(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await _register(client, keys, _body())

    assert response.status_code == 201
    assert "text" not in response.json()
    assert "Refunds are issued" not in response.text


async def test_same_content_again_is_a_no_op_with_the_same_body(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    first = await _register(client, keys, _body())
    again = await _register(client, keys, _body())

    assert first.status_code == 201
    assert again.status_code == 200, again.text
    assert again.json() == first.json()


async def test_same_chunks_in_another_order_are_the_same_content(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    first = await _register(client, keys, _body())
    again = await _register(client, keys, _body(chunks=policy_chunks()[::-1]))

    assert again.status_code == 200, again.text
    assert again.json() == first.json()


async def test_changed_text_under_same_version_is_version_conflict(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    changed = POLICY_TEXT.replace("30 days", "60 days")
    response = await _register(client, keys, _body(text=changed, chunks=policy_chunks(changed)))

    body = _assert_problem(response, 409, "version_conflict")
    assert "60 days" not in response.text
    assert body["title"] == "Version conflict"


async def test_changed_title_under_same_version_is_version_conflict(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    response = await _register(client, keys, _body(title="Returns"))

    _assert_problem(response, 409, "version_conflict")


async def test_removed_title_under_same_version_is_version_conflict(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    response = await _register(client, keys, _body(title=None))

    _assert_problem(response, 409, "version_conflict")


async def test_changed_uri_under_same_version_is_version_conflict(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    response = await _register(client, keys, _body(uri="https://handbook/returns"))

    _assert_problem(response, 409, "version_conflict")


def _changed_chunks(field: str, value: Any) -> list[dict[str, Any]]:
    chunks = policy_chunks()
    chunks[1] = chunks[1] | {field: value}
    return chunks


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("chunk_id", "renamed"),
        ("end", policy_chunks()[1]["end"] - 1),
        ("start", policy_chunks()[1]["start"] + 1),
        ("page", 99),
        ("page", None),
        ("section", "Elsewhere"),
        ("uri", "https://handbook/refunds#famille"),
    ],
)
async def test_changed_chunk_under_same_version_is_version_conflict(
    client: httpx.AsyncClient, keys: Keys, field: str, value: Any
) -> None:
    await register_version(client, keys)

    response = await _register(client, keys, _body(chunks=_changed_chunks(field, value)))

    _assert_problem(response, 409, "version_conflict")


async def test_dropped_chunk_under_same_version_is_version_conflict(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    response = await _register(client, keys, _body(chunks=policy_chunks()[:-1]))

    _assert_problem(response, 409, "version_conflict")


async def test_added_chunk_under_same_version_is_version_conflict(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    extra = {"chunk_id": "whole", "start": 0, "end": len(POLICY_TEXT)}

    response = await _register(client, keys, _body(chunks=[*policy_chunks(), extra]))

    _assert_problem(response, 409, "version_conflict")


async def test_conflicting_registration_leaves_the_version_unchanged(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    first = await register_version(client, keys)
    await _register(client, keys, _body(title="Returns"))

    response = await client.get("/v1/documents/refund-policy", headers=keys.headers("ingest"))

    assert response.status_code == 200
    assert response.json()["versions"] == [first]


async def test_erased_version_cannot_be_registered_again(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    erased = await client.post(
        "/v1/documents/refund-policy/erase",
        json={"reason": "customer request", "request_ref": "DSR-1"},
        headers=keys.headers("ingest"),
    )
    assert erased.status_code == 200, erased.text

    response = await _register(client, keys, _body())

    _assert_problem(response, 409, "version_conflict")


async def test_same_version_name_under_another_document_is_a_new_registration(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    response = await _register(client, keys, _body(title="Other"), document_id="other-policy")

    assert response.status_code == 201, response.text
    assert response.json()["document_id"] == "other-policy"


async def test_same_document_and_version_in_another_tenant_is_independent(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    body = await register_version(client, keys, tenant="globex", title="Globex refunds")

    assert body["tenant"] == "globex"
    assert body["title"] == "Globex refunds"


async def test_version_without_chunks_is_registered(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await _register(client, keys, _body(chunks=[]))

    assert response.status_code == 201, response.text
    assert response.json()["chunk_count"] == 0


async def test_chunk_ending_outside_the_text_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": len(POLICY_TEXT) + 1}]

    response = await _register(client, keys, _body(chunks=chunks))

    body = _assert_problem(response, 422, "validation_error")
    assert body["errors"] == [{"index": 0, "field": "end", "problem": "outside_text"}]


async def test_chunk_starting_outside_the_text_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    length = len(POLICY_TEXT)
    chunks = [
        {"chunk_id": "c1", "start": 0, "end": 5},
        {"chunk_id": "c2", "start": length, "end": length + 2},
    ]

    response = await _register(client, keys, _body(chunks=chunks))

    body = _assert_problem(response, 422, "validation_error")
    assert body["errors"] == [
        {"index": 1, "field": "start", "problem": "outside_text"},
        {"index": 1, "field": "end", "problem": "outside_text"},
    ]


@pytest.mark.parametrize(("start", "end"), [(10, 10), (10, 4)])
async def test_chunk_ending_at_or_before_its_start_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, start: int, end: int
) -> None:
    chunks = [
        {"chunk_id": "c1", "start": 0, "end": 5},
        {"chunk_id": "c2", "start": start, "end": end},
    ]

    response = await _register(client, keys, _body(chunks=chunks))

    body = _assert_problem(response, 422, "validation_error")
    assert body["errors"] == [{"index": 1, "field": "end", "problem": "not_after_start"}]


async def test_chunk_with_negative_start_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [{"chunk_id": "c1", "start": -1, "end": 5}]

    response = await _register(client, keys, _body(chunks=chunks))

    body = _assert_problem(response, 422, "validation_error")
    assert body["errors"] == [{"index": 0, "field": "start", "problem": "outside_text"}]


async def test_duplicate_chunk_ids_are_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [
        {"chunk_id": "c1", "start": 0, "end": 5},
        {"chunk_id": "c2", "start": 5, "end": 9},
        {"chunk_id": "c1", "start": 9, "end": 12},
    ]

    response = await _register(client, keys, _body(chunks=chunks))

    body = _assert_problem(response, 422, "validation_error")
    assert body["errors"] == [{"index": 2, "field": "chunk_id", "problem": "duplicate"}]


async def test_every_bad_chunk_is_listed_by_index(client: httpx.AsyncClient, keys: Keys) -> None:
    length = len(POLICY_TEXT)
    chunks = [
        {"chunk_id": "c1", "start": 0, "end": 5},
        {"chunk_id": "c2", "start": 7, "end": 3},
        {"chunk_id": "c3", "start": 5, "end": length + 10},
        {"chunk_id": "c1", "start": 5, "end": 9},
    ]

    response = await _register(client, keys, _body(chunks=chunks))

    body = _assert_problem(response, 422, "validation_error")
    assert body["errors"] == [
        {"index": 1, "field": "end", "problem": "not_after_start"},
        {"index": 2, "field": "end", "problem": "outside_text"},
        {"index": 3, "field": "chunk_id", "problem": "duplicate"},
    ]


async def test_chunk_problems_never_quote_the_text(client: httpx.AsyncClient, keys: Keys) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": len(POLICY_TEXT) + 1}]

    response = await _register(client, keys, _body(chunks=chunks))

    assert response.status_code == 422
    assert "Refunds are issued" not in response.text
    assert "返金" not in response.text


async def test_rejected_chunks_register_nothing(client: httpx.AsyncClient, keys: Keys) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": len(POLICY_TEXT) + 1}]
    await _register(client, keys, _body(chunks=chunks))

    response = await client.get("/v1/documents/refund-policy", headers=keys.headers("ingest"))

    _assert_problem(response, 404, "not_found")


async def test_chunk_page_outside_the_stored_range_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": 5, "page": 2**40}]

    response = await _register(client, keys, _body(chunks=chunks))

    _assert_problem(response, 422, "validation_error")


async def test_document_lists_versions_in_registration_order(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    # Version names sort the other way round, so the order can only come from registration.
    registered = [
        await register_version(client, keys, version=name, title=f"Refunds {name}")
        for name in ("v3", "v1", "v2")
    ]

    response = await client.get("/v1/documents/refund-policy", headers=keys.headers("ingest"))

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["tenant"] == "acme"
    assert body["document_id"] == "refund-policy"
    assert [v["version"] for v in body["versions"]] == ["v3", "v1", "v2"]
    assert body["versions"] == registered


async def test_document_lists_erased_versions_without_their_hash(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    kept = await register_version(client, keys, version="v2")
    erased = await client.post(
        "/v1/documents/refund-policy/erase",
        json={"reason": "customer request", "request_ref": "DSR-7", "versions": ["v1"]},
        headers=keys.headers("ingest"),
    )
    assert erased.status_code == 200, erased.text

    response = await client.get("/v1/documents/refund-policy", headers=keys.headers("ingest"))

    first, second = response.json()["versions"]
    assert first["version"] == "v1"
    assert first["erased_at"] == erased.json()["erased_at"]
    assert first["sha256"] is None
    assert second == kept


async def test_unknown_document_is_not_found(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.get("/v1/documents/no-such-document", headers=keys.headers("ingest"))

    body = _assert_problem(response, 404, "not_found")
    assert body["title"] == "Not found"


async def test_another_tenants_document_is_not_found_exactly_like_a_missing_one(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, tenant="globex", document_id="globex-policy")

    theirs = await client.get("/v1/documents/globex-policy", headers=keys.headers("ingest"))
    missing = await client.get("/v1/documents/never-registered", headers=keys.headers("ingest"))

    _assert_problem(theirs, 404, "not_found")
    assert theirs.json() == missing.json()
    assert dict(theirs.headers) | {"x-request-id": ""} == dict(missing.headers) | {
        "x-request-id": ""
    }


async def test_another_tenants_document_cannot_be_erased(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, tenant="globex")

    response = await client.post(
        "/v1/documents/refund-policy/erase",
        json={"reason": "customer request", "request_ref": "DSR-2"},
        headers=keys.headers("ingest"),
    )

    _assert_problem(response, 404, "not_found")
    still = await client.get(
        "/v1/documents/refund-policy", headers=keys.headers("ingest", tenant="globex")
    )
    assert still.json()["versions"][0]["erased_at"] is None


async def test_registering_under_one_tenant_is_invisible_to_another(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    response = await client.get(
        "/v1/documents/refund-policy", headers=keys.headers("ingest", tenant="globex")
    )

    _assert_problem(response, 404, "not_found")


async def test_erasure_answers_its_record_and_is_idempotent(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    await register_version(client, keys, version="v2")
    request = {"reason": "customer request", "request_ref": "DSR-9"}

    first = await client.post(
        "/v1/documents/refund-policy/erase", json=request, headers=keys.headers("ingest")
    )
    again = await client.post(
        "/v1/documents/refund-policy/erase", json=request, headers=keys.headers("ingest")
    )

    assert first.status_code == 200, first.text
    body = first.json()
    assert body["erasure_id"].startswith("era_")
    assert body["document_id"] == "refund-policy"
    assert body["versions"] == ["v1", "v2"]
    assert body["request_ref"] == "DSR-9"
    assert again.status_code == 200
    assert again.json() == body


@pytest.mark.parametrize(
    ("field", "value"),
    [("start", "0"), ("start", True), ("end", 5.0), ("page", "1"), ("chunk_id", 7)],
)
async def test_chunk_with_a_wrong_json_type_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, field: str, value: Any
) -> None:
    chunk = {"chunk_id": "c1", "start": 0, "end": 5, "page": 1} | {field: value}

    response = await _register(client, keys, _body(chunks=[chunk]))

    body = _assert_problem(response, 422, "validation_error")
    assert [e["loc"][:4] for e in body["errors"]] == [["body", "chunks", 0, field]]


@pytest.mark.parametrize(
    "text", ["Refunds\x00 are issued", "Refunds \ud83d are issued"], ids=["nul", "lone-surrogate"]
)
async def test_text_the_database_cannot_hold_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, text: str
) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": 7}]

    # Escaped JSON, as a client would send a lone surrogate (`\ud83d`) or a NUL (`\u0000`).
    response = await client.post(
        "/v1/documents/refund-policy/versions",
        content=json.dumps(_body(text=text, chunks=chunks)).encode("ascii"),
        headers=keys.headers("ingest") | {"content-type": "application/json"},
    )

    body = _assert_problem(response, 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [["body", "text"]]
    assert "are issued" not in response.text


@pytest.mark.parametrize("field", ["title", "uri", "version"])
async def test_nul_character_in_metadata_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, field: str
) -> None:
    response = await _register(client, keys, _body(**{field: "Refunds\x00"}))

    _assert_problem(response, 422, "validation_error")
    missing = await client.get("/v1/documents/refund-policy", headers=keys.headers("ingest"))
    assert missing.status_code == 404


async def test_nul_character_in_the_document_id_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await _register(client, keys, _body(), document_id="refund%00policy")

    _assert_problem(response, 422, "validation_error")


@pytest.fixture
def small_app(settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]) -> FastAPI:
    assert settings.database_url is not None
    limits = Settings(
        database_url=settings.database_url, max_text_chars=40, max_chunks_per_version=2
    )
    app = create_app(limits)
    app.state.sessionmaker = sessionmaker
    return app


@pytest.fixture
async def small_client(small_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=small_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://grounding.test") as client:
        yield client


async def test_text_over_the_limit_is_payload_too_large(
    small_client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [{"chunk_id": "c1", "start": 0, "end": 5}]

    response = await _register(small_client, keys, _body(text="x" * 41, chunks=chunks))
    at_limit = await _register(small_client, keys, _body(text="x" * 40, chunks=chunks))

    body = _assert_problem(response, 413, "payload_too_large")
    assert body["limit"] == 40
    assert at_limit.status_code == 201, at_limit.text


async def test_chunks_over_the_limit_are_payload_too_large(
    small_client: httpx.AsyncClient, keys: Keys
) -> None:
    chunks = [{"chunk_id": f"c{i}", "start": i, "end": i + 1} for i in range(3)]

    response = await _register(small_client, keys, _body(text="abcdef", chunks=chunks))

    body = _assert_problem(response, 413, "payload_too_large")
    assert body["limit"] == 2


async def test_document_id_longer_than_a_result_may_name_is_validation_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await _register(client, keys, _body(), document_id="d" * 257)

    body = _assert_problem(response, 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [["path", "document_id"]]


async def test_document_with_the_longest_id_is_registered_and_citable(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    document_id = "d" * 256
    chunks = policy_chunks()[:1]
    await register_version(client, keys, document_id=document_id, chunks=chunks)

    body = await record_run(client, keys, results=results_for(chunks, document_id=document_id))

    assert body["citations"][0]["document_id"] == document_id


async def test_ids_too_long_in_bytes_are_validation_errors_not_500(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    astral = "\U0001d518" * 100  # 100 code points, 400 bytes of UTF-8
    by_path = await client.post(
        f"/v1/documents/{astral}/versions",
        json={
            "version": "v1",
            "text": "words",
            "chunks": [{"chunk_id": "c", "start": 0, "end": 5}],
        },
        headers=keys.headers("ingest"),
    )
    by_body = await client.post(
        "/v1/documents/d/versions",
        json={
            "version": astral,
            "text": "words",
            "chunks": [{"chunk_id": astral, "start": 0, "end": 5}],
        },
        headers=keys.headers("ingest"),
    )
    assert (by_path.status_code, by_body.status_code) == (422, 422)
    assert by_path.json()["code"] == by_body.json()["code"] == "validation_error"
