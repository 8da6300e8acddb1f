"""Errors over HTTP: one problem+json shape, no echoed input, body limits, the database gone."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker
from starlette.types import Message, Scope

from app.config import Settings
from app.db import create_engine, create_sessionmaker, head_revision
from app.main import create_app
from tests.factories import Keys, policy_chunks, register_version, results_for

PROBLEM_JSON = "application/problem+json"
PROBLEM_MEMBERS = {"type", "title", "status", "detail", "code"}
# A string no error message of the service would contain unless it copied it from the input.
DISTINCTIVE = "Refunds-are-issued-within-30-days-7f3a9c"
UNREACHABLE_URL = "postgresql+asyncpg://postgres@127.0.0.1:1/grounding"


def _assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert set(body) >= PROBLEM_MEMBERS
    assert body["type"] == f"urn:grounding:problem:{code}"
    assert body["status"] == status
    assert body["code"] == code
    assert isinstance(body["title"], str)
    assert body["title"]
    assert isinstance(body["detail"], str)
    assert body["detail"]
    return body


async def _client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://grounding.test") as client:
        yield client


@pytest.fixture
async def small_client(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app whose body limit is 2048 bytes."""
    assert settings.database_url is not None
    app = create_app(Settings(database_url=settings.database_url, max_body_bytes=2048))
    app.state.sessionmaker = sessionmaker
    async for client in _client(app):
        yield client


@pytest.fixture
async def unreachable_client() -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app whose database is a port where nothing listens."""
    unreachable = Settings(database_url=UNREACHABLE_URL, db_connect_timeout=1, retry_after=7)
    engine = create_engine(unreachable, UNREACHABLE_URL)
    app = create_app(unreachable)
    app.state.sessionmaker = create_sessionmaker(engine)
    try:
        async for client in _client(app):
            yield client
    finally:
        await engine.dispose()


@pytest.mark.parametrize("path", ["/nowhere", "/v1/nowhere", "/v1/documents", "/v1/runs/a/b/c"])
async def test_unknown_route_is_not_found(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path)

    body = _assert_problem(response, 404, "not_found")
    assert body["title"] == "Not found"


async def test_unknown_route_says_nothing_of_the_path(client: httpx.AsyncClient) -> None:
    response = await client.get(f"/v1/{DISTINCTIVE}")

    _assert_problem(response, 404, "not_found")
    assert DISTINCTIVE not in response.text


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/runs", "POST"),
        ("DELETE", "/v1/runs/run_x", "GET"),
        ("PUT", "/v1/documents/refund-policy", "GET"),
        ("GET", "/v1/documents/refund-policy/versions", "POST"),
        ("POST", "/v1/admin/keys/key_x", "DELETE"),
        ("POST", "/healthz", "GET"),
    ],
)
async def test_wrong_method_is_method_not_allowed_naming_the_allowed_ones(
    client: httpx.AsyncClient, method: str, path: str, allowed: str
) -> None:
    response = await client.request(method, path)

    body = _assert_problem(response, 405, "method_not_allowed")
    assert body["title"] == "Method not allowed"
    assert response.headers["allow"] == allowed


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/runs", {"results": [{"document_id": "d", "chunk_id": "c", "start": DISTINCTIVE}]}),
        ("/v1/runs", {"results": DISTINCTIVE}),
        ("/v1/runs", {"query": [DISTINCTIVE], "results": []}),
        ("/v1/runs", {"results": [], "unexpected": DISTINCTIVE}),
        ("/v1/runs", {"results": [{"document_id": "d", "chunk_id": "c", "score": DISTINCTIVE}]}),
        (
            "/v1/documents/refund-policy/versions",
            {"version": "v1", "text": "Refunds", "chunks": DISTINCTIVE},
        ),
        (
            "/v1/documents/refund-policy/versions",
            {"version": "v1", "text": [DISTINCTIVE], "chunks": []},
        ),
        (
            "/v1/documents/refund-policy/versions",
            {"version": "v1", "text": "x", "title": "x" * 5000 + DISTINCTIVE, "chunks": []},
        ),
        (
            "/v1/documents/refund-policy/versions",
            {"version": "v1", "text": "x", "chunks": [{"chunk_id": "c", "start": DISTINCTIVE}]},
        ),
    ],
)
async def test_validation_error_does_not_echo_input_values(
    client: httpx.AsyncClient, keys: Keys, path: str, body: dict[str, Any]
) -> None:
    scope = "agent" if path == "/v1/runs" else "ingest"

    response = await client.post(path, json=body, headers=keys.headers(scope))

    problem = _assert_problem(response, 422, "validation_error")
    assert DISTINCTIVE not in response.text
    assert problem["errors"]
    for error in problem["errors"]:
        assert set(error) == {"loc", "msg", "type"}
        assert error["loc"][0] == "body"


async def test_malformed_json_is_validation_error_without_echoing_it(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        "/v1/documents/refund-policy/versions",
        content=f'{{"version": "v1", "text": "{DISTINCTIVE}", "chunks": ['.encode(),
        headers=keys.headers("ingest") | {"content-type": "application/json"},
    )

    problem = _assert_problem(response, 422, "validation_error")
    assert DISTINCTIVE not in response.text
    assert [e["type"] for e in problem["errors"]] == ["json_invalid"]


async def test_validation_error_names_where_the_input_went_wrong(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        "/v1/runs",
        json={"results": [{"document_id": "d", "chunk_id": "c", "end": "five"}]},
        headers=keys.headers("agent"),
    )

    problem = _assert_problem(response, 422, "validation_error")
    assert problem["detail"] == "the request is not valid"
    assert problem["errors"] == [
        {
            "loc": ["body", "results", 0, "end"],
            "msg": "Input should be a valid integer",
            "type": "int_type",
        }
    ]


async def test_body_over_the_limit_is_payload_too_large(
    small_client: httpx.AsyncClient, keys: Keys
) -> None:
    content = b'{"results": [], "query": "' + b"q" * 3000 + b'"}'

    response = await small_client.post(
        "/v1/runs",
        content=content,
        headers=keys.headers("agent") | {"content-type": "application/json"},
    )

    body = _assert_problem(response, 413, "payload_too_large")
    assert body["limit"] == 2048
    assert body["title"] == "Payload too large"
    assert response.headers["connection"] == "close"


async def test_body_over_the_limit_is_refused_before_parsing_or_authentication(
    small_client: httpx.AsyncClient,
) -> None:
    # Neither JSON nor authorized: only a limit checked before both can answer 413.
    response = await small_client.post(
        "/v1/runs", content=b"{" * 4096, headers={"content-type": "application/json"}
    )

    _assert_problem(response, 413, "payload_too_large")


async def test_chunked_body_without_content_length_over_the_limit_is_payload_too_large(
    small_client: httpx.AsyncClient, keys: Keys
) -> None:
    async def stream() -> AsyncIterator[bytes]:
        yield b'{"results": [], "query": "'
        for _ in range(4):
            yield b"q" * 1000
        yield b'"}'

    request = small_client.build_request(
        "POST",
        "/v1/runs",
        content=stream(),
        headers=keys.headers("agent") | {"content-type": "application/json"},
    )
    assert "content-length" not in request.headers

    response = await small_client.send(request)

    body = _assert_problem(response, 413, "payload_too_large")
    assert body["limit"] == 2048


async def test_chunked_body_within_the_limit_reaches_the_route_whole(
    small_client: httpx.AsyncClient, keys: Keys
) -> None:
    query = "q" * 1500

    async def stream() -> AsyncIterator[bytes]:
        yield b'{"results": [], '
        yield b'"query": "' + query[:700].encode()
        yield query[700:].encode() + b'"}'

    response = await small_client.post(
        "/v1/runs",
        content=stream(),
        headers=keys.headers("agent") | {"content-type": "application/json"},
    )

    assert response.status_code == 201, response.text
    assert response.json()["query"] == query


async def test_body_exactly_at_the_limit_is_accepted(
    small_client: httpx.AsyncClient, keys: Keys
) -> None:
    head, tail = b'{"results": [], "query": "', b'"}'
    content = head + b"q" * (2048 - len(head) - len(tail)) + tail
    assert len(content) == 2048

    response = await small_client.post(
        "/v1/runs",
        content=content,
        headers=keys.headers("agent") | {"content-type": "application/json"},
    )

    assert response.status_code == 201, response.text


async def test_unreachable_database_is_service_unavailable_with_retry_after(
    unreachable_client: httpx.AsyncClient,
) -> None:
    headers = {"Authorization": "Bearer gsk_key_0123456789abcdef_whatever"}

    read = await unreachable_client.get("/v1/runs/run_x", headers=headers)
    write = await unreachable_client.post("/v1/runs", json={"results": []}, headers=headers)

    for response in (read, write):
        body = _assert_problem(response, 503, "service_unavailable")
        assert body["detail"] == "the database cannot be reached"
        assert response.headers["retry-after"] == "7"


async def test_readiness_fails_with_retry_after_when_the_database_is_unreachable(
    unreachable_client: httpx.AsyncClient,
) -> None:
    response = await unreachable_client.get("/readyz")

    _assert_problem(response, 503, "service_unavailable")
    assert response.headers["retry-after"] == "7"


async def test_liveness_does_not_need_the_database(
    unreachable_client: httpx.AsyncClient,
) -> None:
    response = await unreachable_client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_healthz_is_ok(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_is_ready_at_the_head_revision(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")

    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "revision": head_revision()}


async def test_every_response_carries_a_request_id(client: httpx.AsyncClient) -> None:
    ok = await client.get("/healthz")
    problem = await client.get("/nowhere")

    for response in (ok, problem):
        assert re.fullmatch(r"[0-9a-f]{16}", response.headers["x-request-id"])
    assert ok.headers["x-request-id"] != problem.headers["x-request-id"]


async def test_a_safe_request_id_is_kept_and_an_unsafe_one_replaced(
    client: httpx.AsyncClient,
) -> None:
    kept = await client.get("/healthz", headers={"x-request-id": "req-42.a_b"})
    replaced = await client.get("/healthz", headers={"x-request-id": "x" * 129})

    assert kept.headers["x-request-id"] == "req-42.a_b"
    assert re.fullmatch(r"[0-9a-f]{16}", replaced.headers["x-request-id"])


async def test_every_kind_of_error_has_the_problem_shape(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [bad_result] = results_for(policy_chunks()[:1], version="never")
    cases: list[tuple[httpx.Response, int, str]] = [
        (await client.get("/v1/runs/run_x"), 401, "unauthorized"),
        (await client.get("/v1/runs/run_x", headers=keys.headers("ingest")), 403, "forbidden"),
        (await client.get("/v1/runs/run_x", headers=keys.headers("agent")), 404, "not_found"),
        (await client.delete("/v1/runs"), 405, "method_not_allowed"),
        (
            await client.post(
                "/v1/documents/refund-policy/versions",
                json={"version": "2026-11-03", "text": "changed", "chunks": []},
                headers=keys.headers("ingest"),
            ),
            409,
            "version_conflict",
        ),
        (
            await client.post("/v1/runs", json={"results": 1}, headers=keys.headers("agent")),
            422,
            "validation_error",
        ),
        (
            await client.post(
                "/v1/runs", json={"results": [bad_result]}, headers=keys.headers("agent")
            ),
            422,
            "configuration_error",
        ),
    ]

    for response, status, code in cases:
        _assert_problem(response, status, code)


async def test_request_whose_client_left_mid_body_is_not_handled(
    app: FastAPI, keys: Keys, connection: AsyncConnection
) -> None:
    # The part that arrived is valid JSON on its own: only the missing rest says it is not whole.
    messages: list[Message] = [
        {"type": "http.request", "body": b'{"results": []}', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/runs",
        "raw_path": b"/v1/runs",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", keys.headers("agent")["Authorization"].encode()),
            (b"content-type", b"application/json"),
        ],
        "server": ("grounding.test", 80),
        "client": ("127.0.0.1", 4321),
    }

    await app(scope, receive, send)

    assert sent == []
    await connection.execute(text("SELECT set_config('app.tenant', 'acme', true)"))
    runs = await connection.execute(text("SELECT count(*) FROM runs WHERE tenant = 'acme'"))
    assert runs.scalar_one() == 0
    # The whole body, sent the same way, is handled: a run that the same count sees.
    messages.append({"type": "http.request", "body": b'{"results": []}', "more_body": False})
    await app(scope, receive, send)
    assert sent[0]["status"] == 201
    runs = await connection.execute(text("SELECT count(*) FROM runs WHERE tenant = 'acme'"))
    assert runs.scalar_one() == 1
