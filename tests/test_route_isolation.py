"""Isolation and scopes, generated from the app's route table, so a route added later is covered
without anyone remembering: it fails here until it has a sample request and a scope rule."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.access import service as access
from app.access.service import SCOPES
from tests.factories import POLICY_TEXT, Keys, policy_chunks, record_run, register_version

READERS = frozenset({"agent", "support", "admin"})

# Who may call what: (method, path pattern) -> the scopes admitted. Every /v1 route must match.
SCOPE_RULES: list[tuple[str, str, frozenset[str]]] = [
    ("POST", r"^/v1/documents/\{document_id\}/versions$", frozenset({"ingest"})),
    ("POST", r"^/v1/documents/\{document_id\}/erase$", frozenset({"ingest"})),
    ("GET", r"^/v1/documents/\{document_id\}$", frozenset({"ingest", "admin"})),
    ("POST", r"^/v1/runs$", frozenset({"agent"})),
    ("POST", r"^/v1/runs/\{run_id\}/answers$", frozenset({"agent"})),
    ("POST", r"^/v1/memory$", frozenset({"agent"})),
    ("POST", r"^/v1/citations/resolve$", READERS),
    ("GET", r"^/v1/(runs|answers|citations|memory)/", READERS),
    ("GET", r"^/v1/audit/", frozenset({"audit", "admin"})),
    ("POST", r"^/v1/admin/", frozenset({"admin"})),
    ("DELETE", r"^/v1/admin/", frozenset({"admin"})),
]


@dataclass(frozen=True)
class Ids:
    """The ids a request can name, by path or query parameter name."""

    values: dict[str, str]
    citations: list[dict[str, Any]]

    def __getitem__(self, name: str) -> str:
        return self.values[name]


def _bodies() -> dict[tuple[str, str], Callable[[Ids], dict[str, Any]]]:
    chunk = policy_chunks()[0]
    return {
        ("POST", "/v1/documents/{document_id}/versions"): lambda ids: {
            "version": ids["version"],
            "text": "Another tenant's words.",
            "chunks": [{"chunk_id": "c1", "start": 0, "end": 7}],
        },
        ("POST", "/v1/documents/{document_id}/erase"): lambda ids: {
            "reason": "right to erasure",
            "request_ref": "DSR-9",
        },
        ("POST", "/v1/runs"): lambda ids: {
            "results": [
                {
                    "document_id": ids["document_id"],
                    "version": ids["version"],
                    "chunk_id": chunk["chunk_id"],
                    "start": chunk["start"],
                    "end": chunk["end"],
                }
            ]
        },
        ("POST", "/v1/runs/{run_id}/answers"): lambda ids: {
            "claims": [{"text": "A claim.", "citation_ids": [ids["citation_id"]]}],
            "citations": ids.citations,
        },
        ("POST", "/v1/memory"): lambda ids: {
            "text": "A memory.",
            "citation_ids": [ids["citation_id"]],
        },
        ("POST", "/v1/citations/resolve"): lambda ids: {"citation_ids": [ids["citation_id"]]},
        ("POST", "/v1/admin/tenants"): lambda ids: {"name": "initech"},
        ("POST", "/v1/admin/keys"): lambda ids: {"tenant": "globex", "scopes": ["support"]},
    }


@dataclass(frozen=True)
class Route:
    """One operation of the app, as its OpenAPI document (generated from the routes) lists it."""

    method: str
    path: str
    query: tuple[str, ...]


def _routes(app: FastAPI) -> list[Route]:
    return sorted(
        (
            Route(
                method=method.upper(),
                path=path,
                query=tuple(
                    p["name"] for p in operation.get("parameters", []) if p["in"] == "query"
                ),
            )
            for path, operations in app.openapi()["paths"].items()
            if path.startswith("/v1/")
            for method, operation in operations.items()
        ),
        key=lambda route: (route.path, route.method),
    )


def _request(route: Route, ids: Ids, headers: dict[str, str]) -> tuple[str, dict[str, Any]]:
    path = re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], route.path)
    params = {name: ids[name] for name in route.query if name in ids.values}
    kwargs: dict[str, Any] = {"headers": headers, "params": params}
    if route.method in ("POST", "PUT", "PATCH"):
        sample = _bodies().get((route.method, route.path))
        assert sample is not None, f"add a sample body for {route.method} {route.path}"
        kwargs["json"] = sample(ids)
    return path, kwargs


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if k not in ("detail",)}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__


async def _every_tenant_scope_key(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: str
) -> dict[str, str]:
    """A key with every scope bound to its tenant: all but `admin`, which reads every tenant."""
    tenant_scopes = [scope for scope in SCOPES if scope != "admin"]
    async with sessionmaker() as session, session.begin():
        issued = await access.create_key(session, tenant=tenant, scopes=tenant_scopes)
    return {"Authorization": f"Bearer {issued.secret}"}


async def _acme_world(client: httpx.AsyncClient, keys: Keys) -> tuple[Ids, set[str]]:
    """Every kind of resource of tenant acme; returns their ids and what must never leak."""
    await register_version(client, keys)
    run = await record_run(client, keys)
    citation = run["citations"][0]
    answer = await client.post(
        f"/v1/runs/{run['run_id']}/answers",
        json={
            "claims": [
                {"text": "Refunds take a month.", "citation_ids": [citation["citation_id"]]}
            ],
            "citations": run["citations"],
        },
        headers=keys.headers("agent"),
    )
    memory = await client.post(
        "/v1/memory",
        json={"text": "Refunds take a month.", "citation_ids": [citation["citation_id"]]},
        headers=keys.headers("agent"),
    )
    assert (answer.status_code, memory.status_code) == (200, 201)
    ids = Ids(
        values={
            "document_id": "refund-policy",
            "version": "2026-11-03",
            "run_id": run["run_id"],
            "citation_id": citation["citation_id"],
            "verification_id": answer.json()["verification_id"],
            "memory_id": memory.json()["memory_id"],
            "key_id": "key_0000000000000000",
        },
        citations=run["citations"],
    )
    secret = {v for k, v in ids.values.items() if k not in ("document_id", "version")}
    secret |= {c["citation_id"] for c in run["citations"]}
    # Any sixteen characters of the text, at each chunk's start.
    secret |= {POLICY_TEXT[c["start"] : c["start"] + 16] for c in policy_chunks()}
    return ids, secret


def _never_existing(ids: Ids) -> Ids:
    fresh = {k: f"{v[:4]}never_existed" for k, v in ids.values.items()}
    fresh["document_id"], fresh["version"] = "no-such-document", "no-such-version"
    citations = [{**c, "citation_id": fresh["citation_id"]} for c in ids.citations[:1]]
    return Ids(values=fresh, citations=citations)


async def test_another_tenants_ids_answer_as_ids_that_never_existed(
    app: FastAPI,
    client: httpx.AsyncClient,
    keys: Keys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    acme, secret = await _acme_world(client, keys)
    nowhere = _never_existing(acme)
    globex = await _every_tenant_scope_key(sessionmaker, "globex")
    checked = 0
    for route in _routes(app):
        path, sent = _request(route, acme, globex)
        theirs = await client.request(route.method, path, **sent)
        path, kwargs = _request(route, nowhere, globex)
        never = await client.request(route.method, path, **kwargs)
        where = f"{route.method} {route.path}"
        assert theirs.status_code == never.status_code, where
        assert _shape(theirs.json()) == _shape(never.json()), where
        if theirs.status_code == 404:
            assert theirs.json() == never.json(), where
        # Echoing back what the caller itself sent (as `missing`, say) leaks nothing.
        leaked = [s for s in secret if s in theirs.text and s not in f"{path} {sent}"]
        assert leaked == [], where
        checked += 1
    assert checked >= 12


def _admitted(method: str, path: str) -> frozenset[str]:
    for rule_method, pattern, scopes in SCOPE_RULES:
        if rule_method == method and re.match(pattern, path):
            return scopes
    raise AssertionError(f"add a scope rule for {method} {path}")


@pytest.mark.parametrize("scope", SCOPES)
async def test_every_route_admits_exactly_its_scopes(
    app: FastAPI, client: httpx.AsyncClient, keys: Keys, scope: str
) -> None:
    acme, _ = await _acme_world(client, keys)
    for route in _routes(app):
        path, kwargs = _request(route, _never_existing(acme), keys.headers(scope))
        response = await client.request(route.method, path, **kwargs)
        where = f"{scope} -> {route.method} {route.path}: {response.status_code}"
        if scope in _admitted(route.method, route.path):
            assert response.status_code not in (401, 403), where
        else:
            assert response.status_code == 403, where
            assert response.json()["code"] == "forbidden", where
