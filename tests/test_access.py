"""Keys and scopes over HTTP: who gets in (401), what they may do (403), and the admin surface."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.factories import Keys, policy_chunks, register_version, results_for

PROBLEM_JSON = "application/problem+json"
UNAUTHORIZED = {
    "type": "urn:grounding:problem:unauthorized",
    "title": "Unauthorized",
    "status": 401,
    "detail": "a valid API key is required",
    "code": "unauthorized",
}


def _key_id(secret: str) -> str:
    # Secrets read gsk_<key_id>_<random>, and key ids read key_<hex>.
    return "_".join(secret.split("_")[1:3])


def _without_request_id(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k != "x-request-id"}


def _assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    return body


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def _get_run(client: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    return await client.get("/v1/runs/run_nonexistent", headers=headers)


async def _create_key(
    client: httpx.AsyncClient, keys: Keys, *, tenant: str, scopes: list[str]
) -> dict[str, Any]:
    response = await client.post(
        "/v1/admin/keys", json={"tenant": tenant, "scopes": scopes}, headers=keys.headers("admin")
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def _written(connection: AsyncConnection) -> int:
    """Runs and versions of `acme`, and the tenant `initech`: what the routes below create."""
    await connection.execute(text("SELECT set_config('app.tenant', 'acme', true)"))
    written = await connection.execute(
        text(
            "SELECT (SELECT count(*) FROM runs WHERE tenant = 'acme')"
            " + (SELECT count(*) FROM document_versions WHERE tenant = 'acme')"
            " + (SELECT count(*) FROM tenants WHERE name = 'initech')"
        )
    )
    return int(written.scalar_one())


def _tampered(secret: str) -> str:
    last = "A" if secret[-1] != "A" else "B"
    return secret[:-1] + last


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer    "},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "gsk_key_0123456789abcdef_secret"},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Bearer gsk_key_0123456789abcdef_doesnotexist"},
        {"Authorization": "Bearer gsk_key_"},
        {"Authorization": "Bearer gsk_nokey_0123_abc"},
    ],
    ids=[
        "no-header",
        "empty",
        "scheme-only",
        "blank-secret",
        "basic-scheme",
        "no-scheme",
        "malformed-secret",
        "unknown-key",
        "truncated",
        "wrong-prefix",
    ],
)
async def test_request_without_a_key_that_opens_is_unauthorized(
    client: httpx.AsyncClient, keys: Keys, headers: dict[str, str]
) -> None:
    response = await _get_run(client, headers)

    assert response.status_code == 401
    assert response.headers["content-type"] == PROBLEM_JSON
    assert response.json() == UNAUTHORIZED


async def test_wrong_secret_for_a_real_key_is_unauthorized(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    secret = keys.secrets[("acme", "agent")]

    response = await _get_run(client, _bearer(_tampered(secret)))

    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED


async def test_secret_with_a_real_key_id_but_another_keys_random_part_is_unauthorized(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    mine = keys.secrets[("acme", "agent")]
    other = keys.secrets[("acme", "support")]
    spliced = f"gsk_{_key_id(mine)}_{other.split('_', 3)[3]}"

    response = await _get_run(client, _bearer(spliced))

    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED


async def test_every_way_a_key_fails_to_open_looks_the_same(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    real = keys.secrets[("acme", "agent")]
    revoked = await _create_key(client, keys, tenant="acme", scopes=["agent"])
    revoking = await client.delete(
        f"/v1/admin/keys/{revoked['key_id']}", headers=keys.headers("admin")
    )
    assert revoking.status_code == 200, revoking.text

    responses = [
        await _get_run(client, {}),
        await _get_run(client, {"Authorization": "Token abc"}),
        await _get_run(client, _bearer("gsk_key_ffffffffffffffff_nosuchkey")),
        await _get_run(client, _bearer(_tampered(real))),
        await _get_run(client, _bearer(revoked["secret"])),
    ]

    assert {r.status_code for r in responses} == {401}
    assert {r.text for r in responses} == {responses[0].text}
    assert all(_without_request_id(r) == _without_request_id(responses[0]) for r in responses)


async def test_unauthorized_answers_say_how_to_authenticate(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await _get_run(client, {})

    assert response.headers["www-authenticate"] == "Bearer"


async def test_a_key_is_checked_before_the_body(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post("/v1/runs", json={"results": "not a list"})

    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED


async def test_revoked_key_is_unauthorized_on_the_next_request(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    secret = keys.secrets[("acme", "agent")]
    key_id = _key_id(secret)
    before = await client.post("/v1/runs", json={"results": []}, headers=_bearer(secret))
    assert before.status_code == 201, before.text

    revoked = await client.delete(f"/v1/admin/keys/{key_id}", headers=keys.headers("admin"))
    after = await client.post("/v1/runs", json={"results": []}, headers=_bearer(secret))

    assert revoked.status_code == 200, revoked.text
    body = revoked.json()
    assert body["key_id"] == key_id
    assert body["tenant"] == "acme"
    assert body["scopes"] == ["agent"]
    assert body["revoked_at"] is not None
    assert "secret" not in body
    assert after.status_code == 401
    assert after.json() == UNAUTHORIZED


async def test_revoking_again_keeps_the_first_revocation(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    key_id = _key_id(keys.secrets[("acme", "support")])

    first = await client.delete(f"/v1/admin/keys/{key_id}", headers=keys.headers("admin"))
    again = await client.delete(f"/v1/admin/keys/{key_id}", headers=keys.headers("admin"))

    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()


async def test_revoking_an_unknown_key_is_not_found(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.delete(
        "/v1/admin/keys/key_0000000000000000", headers=keys.headers("admin")
    )

    _assert_problem(response, 404, "not_found")


async def test_revoking_one_key_leaves_the_others_open(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await client.delete(
        f"/v1/admin/keys/{_key_id(keys.secrets[('acme', 'agent')])}",
        headers=keys.headers("admin"),
    )

    response = await client.post(
        "/v1/runs", json={"results": []}, headers=keys.headers("agent", tenant="globex")
    )

    assert response.status_code == 201, response.text


# One request per route family, each sent with keys lacking the scope it needs.
ROUTES: dict[str, tuple[str, str, dict[str, Any] | None, set[str]]] = {
    "register a version": (
        "POST",
        "/v1/documents/refund-policy/versions",
        {"version": "v1", "text": "Refunds", "chunks": []},
        {"ingest"},
    ),
    "read a document": ("GET", "/v1/documents/refund-policy", None, {"ingest", "admin"}),
    "erase a document": (
        "POST",
        "/v1/documents/refund-policy/erase",
        {"reason": "request", "request_ref": "DSR-1"},
        {"ingest"},
    ),
    "record a run": ("POST", "/v1/runs", {"results": []}, {"agent"}),
    "read a run": ("GET", "/v1/runs/run_x", None, {"agent", "support", "admin"}),
    "read a citation": ("GET", "/v1/citations/cit_x", None, {"agent", "support", "admin"}),
    "create a tenant": ("POST", "/v1/admin/tenants", {"name": "initech"}, {"admin"}),
    "create a key": (
        "POST",
        "/v1/admin/keys",
        {"tenant": "acme", "scopes": ["admin"]},
        {"admin"},
    ),
    "revoke a key": ("DELETE", "/v1/admin/keys/key_x", None, {"admin"}),
}
SCOPES = ("ingest", "agent", "support", "audit", "admin")
DENIED = [
    (route, scope)
    for route, (*_, allowed) in ROUTES.items()
    for scope in SCOPES
    if scope not in allowed
]


@pytest.mark.parametrize(("route", "scope"), DENIED, ids=[f"{r}-as-{s}" for r, s in DENIED])
async def test_key_without_the_scope_is_forbidden(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection, route: str, scope: str
) -> None:
    method, path, body, _ = ROUTES[route]

    response = await client.request(method, path, json=body, headers=keys.headers(scope))

    problem = _assert_problem(response, 403, "forbidden")
    assert problem["title"] == "Forbidden"
    assert await _written(connection) == 0


async def test_what_a_forbidden_request_would_have_written_is_counted_when_allowed(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    for route in ("register a version", "record a run", "create a tenant"):
        method, path, body, allowed = ROUTES[route]
        scope = sorted(allowed)[0]
        response = await client.request(method, path, json=body, headers=keys.headers(scope))
        assert response.status_code == 201, response.text

    assert await _written(connection) == 3


async def test_support_key_cannot_record_a_run(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post("/v1/runs", json={"results": []}, headers=keys.headers("support"))

    body = _assert_problem(response, 403, "forbidden")
    assert body["detail"] == "this operation needs one of the scopes: agent"


async def test_agent_key_cannot_register_a_version(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post(
        "/v1/documents/refund-policy/versions",
        json={"version": "v1", "text": "Refunds", "chunks": []},
        headers=keys.headers("agent"),
    )

    body = _assert_problem(response, 403, "forbidden")
    assert body["detail"] == "this operation needs one of the scopes: ingest"


async def test_forbidden_does_not_depend_on_whether_the_resource_exists(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    run = await client.post(
        "/v1/runs",
        json={"results": results_for(policy_chunks()[:1])},
        headers=keys.headers("agent"),
    )
    run_id = run.json()["run_id"]

    existing = await client.get(f"/v1/runs/{run_id}", headers=keys.headers("ingest"))
    missing = await client.get("/v1/runs/run_nonexistent", headers=keys.headers("ingest"))

    _assert_problem(existing, 403, "forbidden")
    assert existing.json() == missing.json()


async def test_admin_creates_a_tenant(client: httpx.AsyncClient, keys: Keys) -> None:
    response = await client.post(
        "/v1/admin/tenants", json={"name": "initech"}, headers=keys.headers("admin")
    )

    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == {"name", "created_at"}
    assert body["name"] == "initech"
    assert datetime.fromisoformat(body["created_at"]).tzinfo is not None


async def test_creating_an_existing_tenant_answers_it_unchanged_with_200(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    first = await client.post(
        "/v1/admin/tenants", json={"name": "initech"}, headers=keys.headers("admin")
    )
    again = await client.post(
        "/v1/admin/tenants", json={"name": "initech"}, headers=keys.headers("admin")
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()


@pytest.mark.parametrize(
    "body",
    [{"name": ""}, {"name": "has space"}, {"name": "-leading"}, {"name": "x" * 129}, {}],
    ids=["empty", "space", "leading-dash", "too-long", "missing"],
)
async def test_invalid_tenant_name_is_validation_error(
    client: httpx.AsyncClient, keys: Keys, body: dict[str, Any]
) -> None:
    response = await client.post("/v1/admin/tenants", json=body, headers=keys.headers("admin"))

    _assert_problem(response, 422, "validation_error")


async def test_admin_creates_a_key_whose_secret_is_shown_once(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await client.post("/v1/admin/tenants", json={"name": "initech"}, headers=keys.headers("admin"))

    body = await _create_key(client, keys, tenant="initech", scopes=["agent", "ingest"])

    assert set(body) == {"key_id", "tenant", "scopes", "created_at", "revoked_at", "secret"}
    assert body["key_id"].startswith("key_")
    assert body["tenant"] == "initech"
    assert body["scopes"] == ["ingest", "agent"]
    assert body["revoked_at"] is None
    assert body["secret"].startswith(f"gsk_{body['key_id']}_")
    revoked = await client.delete(f"/v1/admin/keys/{body['key_id']}", headers=keys.headers("admin"))
    assert "secret" not in revoked.json()
    assert body["secret"] not in revoked.text


async def test_a_new_key_opens_with_its_scopes_in_its_own_tenant(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await client.post("/v1/admin/tenants", json={"name": "initech"}, headers=keys.headers("admin"))
    await register_version(client, keys)
    issued = await _create_key(client, keys, tenant="initech", scopes=["ingest"])

    registered = await client.post(
        "/v1/documents/initech-policy/versions",
        json={"version": "v1", "text": "Refunds", "chunks": []},
        headers=_bearer(issued["secret"]),
    )
    acme_document = await client.get(
        "/v1/documents/refund-policy", headers=_bearer(issued["secret"])
    )
    run = await client.post("/v1/runs", json={"results": []}, headers=_bearer(issued["secret"]))

    assert registered.status_code == 201, registered.text
    assert registered.json()["tenant"] == "initech"
    _assert_problem(acme_document, 404, "not_found")
    _assert_problem(run, 403, "forbidden")


async def test_only_the_sha256_of_a_secret_is_stored(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    issued = await _create_key(client, keys, tenant="acme", scopes=["support"])
    secret = issued["secret"]
    random_part = secret.split("_", 3)[3]

    row = (
        (
            await connection.execute(
                text("SELECT * FROM api_keys WHERE key_id = :key_id"), {"key_id": issued["key_id"]}
            )
        )
        .mappings()
        .one()
    )

    assert row["secret_sha256"] == hashlib.sha256(secret.encode("utf-8")).hexdigest()
    stored = " ".join(str(value) for value in row.values())
    assert secret not in stored
    assert random_part not in stored
    assert [c for c in row if "secret" in c] == ["secret_sha256"]


async def test_duplicate_scopes_are_stored_once(client: httpx.AsyncClient, keys: Keys) -> None:
    body = await _create_key(client, keys, tenant="acme", scopes=["audit", "support", "audit"])

    assert body["scopes"] == ["support", "audit"]


@pytest.mark.parametrize(
    "scopes",
    [["superuser"], ["agent", "root"], [], "agent", None, ["Agent"]],
    ids=["unknown", "one-unknown", "empty", "not-a-list", "null", "wrong-case"],
)
async def test_invalid_scopes_are_validation_error(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection, scopes: Any
) -> None:
    before = (await connection.execute(text("SELECT count(*) FROM api_keys"))).scalar_one()

    response = await client.post(
        "/v1/admin/keys", json={"tenant": "acme", "scopes": scopes}, headers=keys.headers("admin")
    )

    _assert_problem(response, 422, "validation_error")
    after = (await connection.execute(text("SELECT count(*) FROM api_keys"))).scalar_one()
    assert after == before


async def test_key_for_an_unknown_tenant_is_not_found(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    response = await client.post(
        "/v1/admin/keys",
        json={"tenant": "no-such-tenant", "scopes": ["agent"]},
        headers=keys.headers("admin"),
    )

    _assert_problem(response, 404, "not_found")
