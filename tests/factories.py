"""Plain async factories for test data; keyword-only overrides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.access import service as access
from app.access.service import SCOPES

# Text with emoji (a ZWJ family sequence), combining marks and CJK, so offsets are tested where
# code points, UTF-8 bytes and UTF-16 units all differ.
POLICY_TEXT = (
    "Refunds are issued within 30 days. "
    "Famille 👨‍👩‍👧 heureuse: cafe\u0301 re\u0301sume\u0301. "
    "返金は三十日以内に行われます。 "
    "Exchanges need a receipt 🧾."
)


def policy_chunks(text: str = POLICY_TEXT) -> list[dict[str, Any]]:
    """Chunks that split the policy text at its sentences."""
    bounds = []
    start = 0
    for part in ("Refunds", "Famille", "返金", "Exchanges"):
        begin = text.index(part)
        if begin > start:
            bounds.append((start, begin))
        start = begin
    bounds.append((start, len(text)))
    bounds = bounds[1:] if bounds[0][0] == bounds[0][1] else bounds
    return [
        {"chunk_id": f"c{i + 1}", "start": s, "end": e, "page": i + 1, "section": f"S{i + 1}"}
        for i, (s, e) in enumerate(bounds)
    ]


@dataclass(frozen=True)
class Keys:
    """Bearer headers by tenant and scope."""

    secrets: dict[tuple[str, str], str]

    def headers(self, scope: str, *, tenant: str = "acme") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[(tenant, scope)]}"}


async def make_keys(
    sessionmaker: async_sessionmaker[AsyncSession], *, tenants: tuple[str, ...] = ("acme", "globex")
) -> Keys:
    """A key of every scope for each tenant."""
    found: dict[tuple[str, str], str] = {}
    async with sessionmaker() as session, session.begin():
        for tenant in tenants:
            await access.create_tenant(session, name=tenant)
            for scope in SCOPES:
                issued = await access.create_key(session, tenant=tenant, scopes=[scope])
                found[(tenant, scope)] = issued.secret
    return Keys(secrets=found)


async def register_version(
    client: httpx.AsyncClient,
    keys: Keys,
    *,
    tenant: str = "acme",
    document_id: str = "refund-policy",
    version: str = "2026-11-03",
    text: str = POLICY_TEXT,
    chunks: list[dict[str, Any]] | None = None,
    uri: str | None = "https://handbook/refunds",
    title: str | None = "Refunds",
    expect: int = 201,
) -> dict[str, Any]:
    """Register a version through the API and return its body."""
    response = await client.post(
        f"/v1/documents/{document_id}/versions",
        json={
            "version": version,
            "text": text,
            "uri": uri,
            "title": title,
            "chunks": policy_chunks(text) if chunks is None else chunks,
        },
        headers=keys.headers("ingest", tenant=tenant),
    )
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


def results_for(
    chunks: list[dict[str, Any]],
    *,
    document_id: str = "refund-policy",
    version: str = "2026-11-03",
) -> list[dict[str, Any]]:
    """Retrieval results that repeat the registered chunks exactly."""
    return [
        {
            "document_id": document_id,
            "version": version,
            "chunk_id": c["chunk_id"],
            "start": c["start"],
            "end": c["end"],
            "score": 0.9 - i / 100,
            "branches": {"bm25": 11.2, "vector": 0.79, "rerank": 0.93},
        }
        for i, c in enumerate(chunks)
    ]


async def record_run(
    client: httpx.AsyncClient,
    keys: Keys,
    *,
    results: list[dict[str, Any]] | None = None,
    tenant: str = "acme",
    expect: int = 201,
) -> dict[str, Any]:
    """Record a run (over the default policy's chunks unless `results` are given)."""
    response = await client.post(
        "/v1/runs",
        json={
            "query": "how long do refunds take?",
            "scope": "HANDBOOK",
            "results": results_for(policy_chunks()) if results is None else results,
        },
        headers=keys.headers("agent", tenant=tenant),
    )
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


async def erase_document(
    client: httpx.AsyncClient,
    keys: Keys,
    *,
    tenant: str = "acme",
    document_id: str = "refund-policy",
    versions: list[str] | None = None,
    reason: str = "right-to-erasure request",
    request_ref: str = "DSR-0001",
    expect: int = 200,
) -> dict[str, Any]:
    """Erase versions of a document (all of them unless `versions` are named) through the API."""
    payload: dict[str, Any] = {"reason": reason, "request_ref": request_ref}
    if versions is not None:
        payload["versions"] = versions
    response = await client.post(
        f"/v1/documents/{document_id}/erase",
        json=payload,
        headers=keys.headers("ingest", tenant=tenant),
    )
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


def many_chunks(count: int) -> tuple[str, list[dict[str, Any]]]:
    """A text of `count` sentences (emoji and CJK in each) and one chunk per sentence."""
    sentences = [f"Rule {i}: refunds 🧾 返金 within {i} days. " for i in range(count)]
    chunks, start = [], 0
    for i, sentence in enumerate(sentences):
        chunks.append({"chunk_id": f"r{i}", "start": start, "end": start + len(sentence)})
        start += len(sentence)
    return "".join(sentences), chunks


def claim(text: str, *citation_ids: str) -> dict[str, Any]:
    """A claim as an answer carries it."""
    return {"text": text, "citation_ids": list(citation_ids)}


async def submit_answer(
    client: httpx.AsyncClient,
    keys: Keys,
    run_id: str,
    *,
    claims: list[dict[str, Any]],
    citations: list[dict[str, Any]],
    refusal: bool = False,
    tenant: str = "acme",
    expect: int = 200,
) -> dict[str, Any]:
    """Submit an answer for verification and return the body (a problem when `expect` is 422)."""
    response = await client.post(
        f"/v1/runs/{run_id}/answers",
        json={"claims": claims, "citations": citations, "refusal": refusal},
        headers=keys.headers("agent", tenant=tenant),
    )
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body
