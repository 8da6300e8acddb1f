"""Answer verification over HTTP: every class of rejection, refusals, records, reads, statements."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app import bodies
from app.answers import service as answers
from app.citations import service as citations
from app.grounding.models import CitedAnswer
from tests.conftest import Committed, statements_sent
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

PROBLEM = "application/problem+json"


async def policy_run(client: httpx.AsyncClient, keys: Keys, *, tenant: str = "acme") -> Any:
    """The default policy registered for `tenant` and a run over its four chunks."""
    await register_version(client, keys, tenant=tenant)
    return await record_run(client, keys, tenant=tenant)


def ids(run: dict[str, Any]) -> list[str]:
    return [c["citation_id"] for c in run["citations"]]


async def rejected(
    client: httpx.AsyncClient,
    keys: Keys,
    run_id: str,
    *,
    claims: list[dict[str, Any]],
    citations: list[dict[str, Any]],
    refusal: bool = False,
) -> dict[str, Any]:
    """Submit an answer that must be rejected; the problem body, checked for its common shape."""
    response = await client.post(
        f"/v1/runs/{run_id}/answers",
        json={"claims": claims, "citations": citations, "refusal": refusal},
        headers=keys.headers("agent"),
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == 422
    assert body["type"] == f"urn:grounding:problem:{body['code']}"
    assert body["verification_id"].startswith("ver_")
    assert all(isinstance(v["detail"], str) and v["detail"] for v in body["violations"])
    return body


def without_detail(violations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in violation.items() if k != "detail"} for violation in violations]


def answer_sha256(payload: dict[str, Any]) -> str:
    """The submitted answer's canonical JSON digest, without quotes or plain span hashes."""
    answer = CitedAnswer.model_validate(payload).model_dump(mode="json")
    for submitted in answer["claims"]:
        del submitted["quotes"]
    for citation in answer["citations"]:
        del citation["span_sha256"]
    canonical = json.dumps(
        answer,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


async def verification_rows(connection: AsyncConnection, **where: str) -> list[dict[str, Any]]:
    """Rows of `verifications` matching `where` (column = value), read around the app."""
    clause = " AND ".join(f"{column} = :{column}" for column in where) or "true"
    rows = await connection.execute(
        text(f"SELECT * FROM verifications WHERE {clause} ORDER BY created_at"), where
    )
    return [dict(row._mapping) for row in rows]


async def key_id_of(connection: AsyncConnection, keys: Keys, scope: str, tenant: str) -> str:
    header = keys.headers(scope, tenant=tenant)["Authorization"].removeprefix("Bearer ")
    digest = hashlib.sha256(header.encode()).hexdigest()
    found = await connection.scalar(
        text("SELECT key_id FROM api_keys WHERE secret_sha256 = :d"), {"d": digest}
    )
    assert isinstance(found, str)
    return found


# ---------------------------------------------------------------------------------------------
# Passing answers


async def test_grounded_answer_answers_text_claims_and_provenance(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, _ = ids(run)
    claims = [claim("Refunds take 30 days.", c2, c0), claim("返金 🧾.", c1, c2, c0)]
    body = await submit_answer(
        client, keys, run["run_id"], claims=claims, citations=run["citations"]
    )
    assert body["verification_id"].startswith("ver_")
    assert body["outcome"] == "grounded"
    assert body["run_id"] == run["run_id"]
    assert body["text"] == "Refunds take 30 days. 返金 🧾."
    assert [{k: c[k] for k in ("text", "citation_ids")} for c in body["claims"]] == claims
    assert body["provenance"] == [c2, c0, c1]


async def test_answer_carrying_only_the_essential_fields_is_grounded(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    essentials = [
        {k: c[k] for k in ("citation_id", "document_id", "document_version", "tenant")}
        for c in run["citations"][:2]
    ]
    body = await submit_answer(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", essentials[1]["citation_id"])],
        citations=essentials,
    )
    assert body["outcome"] == "grounded"
    assert body["provenance"] == [essentials[1]["citation_id"]]


async def test_refusal_over_an_empty_run_is_refused(client: httpx.AsyncClient, keys: Keys) -> None:
    run = await record_run(client, keys, results=[])
    assert run["citations"] == []
    body = await submit_answer(client, keys, run["run_id"], claims=[], citations=[], refusal=True)
    assert body["outcome"] == "refused"
    assert (body["text"], body["claims"], body["provenance"]) == ("", [], [])


async def test_refusal_over_a_run_with_citations_is_refused(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    body = await submit_answer(
        client, keys, run["run_id"], claims=[], citations=run["citations"], refusal=True
    )
    assert body["outcome"] == "refused"
    assert body["provenance"] == []


# ---------------------------------------------------------------------------------------------
# Each class of rejection, with its exact violations


async def test_citation_of_another_tenant_is_tenant_crossing(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    theirs = await policy_run(client, keys, tenant="globex")
    foreign = theirs["citations"][0]
    body = await rejected(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", ids(run)[0], foreign["citation_id"])],
        citations=[run["citations"][0], foreign],
    )
    assert body["code"] == "tenant_crossing"
    assert without_detail(body["violations"]) == [
        {
            "class": "tenant_crossing",
            "citation": 1,
            "citation_id": foreign["citation_id"],
            "field": "tenant",
        }
    ]


async def test_own_citation_relabelled_to_another_tenant_is_tenant_crossing(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    relabelled = run["citations"][2] | {"tenant": "globex"}
    body = await rejected(
        client, keys, run["run_id"], claims=[claim("A.", ids(run)[2])], citations=[relabelled]
    )
    assert body["code"] == "tenant_crossing"
    assert without_detail(body["violations"]) == [
        {"class": "tenant_crossing", "citation": 0, "citation_id": ids(run)[2], "field": "tenant"}
    ]


async def test_two_citations_sharing_an_id_is_duplicate_citation_id(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    c0, c1, _, _ = ids(run)
    cited = run["citations"]
    body = await rejected(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", c0, c1)],
        citations=[cited[0], cited[1], cited[0]],
    )
    assert body["code"] == "duplicate_citation_id"
    assert without_detail(body["violations"]) == [
        {"class": "duplicate_citation_id", "citation": 2, "citation_id": c0}
    ]


async def test_claim_naming_an_id_the_answer_lacks_is_ungrounded(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, c3 = ids(run)
    body = await rejected(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", c0), claim("B.", c1, c3, "cit_invented", c3)],
        citations=run["citations"][:3],
    )
    assert body["code"] == "ungrounded_citation"
    assert without_detail(body["violations"]) == [
        {
            "class": "ungrounded_citation",
            "claim": 1,
            "missing": [c3, "cit_invented"],
            "available": [c0, c1, c2],
        }
    ]


async def test_citation_this_run_did_not_issue_is_ungrounded(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    other = await record_run(client, keys)
    stray = other["citations"][1]
    body = await rejected(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", stray["citation_id"])],
        citations=[stray],
    )
    assert body["code"] == "ungrounded_citation"
    assert without_detail(body["violations"]) == [
        {
            "class": "ungrounded_citation",
            "citation": 0,
            "citation_id": stray["citation_id"],
            "missing": [stray["citation_id"]],
            "available": ids(run),
        }
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("document_version", "2026-12-01"),
        ("document_id", "shipping-policy"),
        ("chunk_id", "c9"),
        ("span", {"start": 0, "end": 3}),
        ("span_utf8", {"start": 1, "end": 3}),
        ("span_utf16", {"start": 1, "end": 3}),
        ("run_id", "run_elsewhere"),
        ("span_sha256", "0" * 64),
        ("score", 0.5),
        ("branches", {"bm25": 1.0}),
        ("retrieved_at", "2020-01-01T00:00:00Z"),
        ("locator", {"uri": "https://elsewhere", "page": 9, "section": "S9"}),
    ],
)
async def test_citation_whose_pinned_field_differs_is_ungrounded(
    client: httpx.AsyncClient, keys: Keys, field: str, value: Any
) -> None:
    run = await policy_run(client, keys)
    c0, c1, _, _ = ids(run)
    changed = run["citations"][1] | {field: value}
    body = await rejected(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", c0, c1)],
        citations=[run["citations"][0], changed],
    )
    assert body["code"] == "ungrounded_citation"
    assert without_detail(body["violations"]) == [
        {
            "class": "ungrounded_citation",
            "citation": 1,
            "citation_id": c1,
            "field": field,
            "missing": [c1],
            "available": ids(run),
        }
    ]


async def test_claim_resting_on_no_citation_is_uncited(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    body = await rejected(
        client,
        keys,
        run["run_id"],
        claims=[claim("A.", ids(run)[0]), claim("B.")],
        citations=run["citations"],
    )
    assert body["code"] == "uncited_claim"
    assert without_detail(body["violations"]) == [{"class": "uncited_claim", "claim": 1}]


async def test_non_refusal_with_no_claims_is_uncited(client: httpx.AsyncClient, keys: Keys) -> None:
    run = await policy_run(client, keys)
    body = await rejected(client, keys, run["run_id"], claims=[], citations=run["citations"])
    assert body["code"] == "uncited_claim"
    assert without_detail(body["violations"]) == [{"class": "uncited_claim"}]


async def test_any_claim_over_an_empty_run_is_uncited(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await record_run(client, keys, results=[])
    body = await rejected(
        client, keys, run["run_id"], claims=[claim("A."), claim("B.")], citations=[]
    )
    assert body["code"] == "uncited_claim"
    # Each claim breaks two rules: the run retrieved nothing, and the claim names no citation.
    assert [(v["class"], v["claim"], v["detail"]) for v in body["violations"]] == [
        ("uncited_claim", 0, "the run retrieved nothing: only a refusal passes"),
        ("uncited_claim", 0, "the claim rests on no citation"),
        ("uncited_claim", 1, "the run retrieved nothing: only a refusal passes"),
        ("uncited_claim", 1, "the claim rests on no citation"),
    ]


async def test_citations_over_an_empty_run_are_ungrounded_and_claims_uncited(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await record_run(client, keys, results=[])
    elsewhere = await policy_run(client, keys)
    stray = elsewhere["citations"][0]
    body = await rejected(
        client, keys, run["run_id"], claims=[claim("A.", stray["citation_id"])], citations=[stray]
    )
    assert body["code"] == "ungrounded_citation"
    assert without_detail(body["violations"]) == [
        {
            "class": "ungrounded_citation",
            "citation": 0,
            "citation_id": stray["citation_id"],
            "missing": [stray["citation_id"]],
            "available": [],
        },
        {"class": "uncited_claim", "claim": 0},
    ]


async def test_empty_run_over_http_with_no_claims_and_no_refusal_is_uncited(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await record_run(client, keys, results=[])
    body = await rejected(client, keys, run["run_id"], claims=[], citations=[])
    assert body["code"] == "uncited_claim"
    assert without_detail(body["violations"]) == [{"class": "uncited_claim"}]


async def test_refusal_with_claims_is_a_validation_error_and_is_not_recorded(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    response = await client.post(
        f"/v1/runs/{run['run_id']}/answers",
        json={
            "claims": [claim("A.", ids(run)[0])],
            "citations": run["citations"],
            "refusal": True,
        },
        headers=keys.headers("agent"),
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["code"] == "validation_error"
    assert "verification_id" not in body
    assert "violations" not in body
    assert await verification_rows(connection, run_id=run["run_id"]) == []


# ---------------------------------------------------------------------------------------------
# The code is the first class present


ORDER = ("tenant_crossing", "duplicate_citation_id", "ungrounded_citation", "uncited_claim")


@pytest.mark.parametrize(
    "present",
    [
        ORDER,
        ORDER[1:],
        ORDER[2:],
        ORDER[3:],
        ("tenant_crossing", "uncited_claim"),
        ("duplicate_citation_id", "uncited_claim"),
        ("tenant_crossing", "ungrounded_citation"),
    ],
)
async def test_code_is_the_first_class_present_and_every_violation_is_listed(
    client: httpx.AsyncClient, keys: Keys, present: tuple[str, ...]
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, c3 = ids(run)
    cited = list(run["citations"])
    claims = [claim(f"Claim {i}.", cid) for i, cid in enumerate((c0, c1, c2, c3))]
    if "tenant_crossing" in present:
        cited[0] = cited[0] | {"tenant": "globex"}
    if "ungrounded_citation" in present:
        cited[2] = cited[2] | {"document_version": "2099-01-01"}
    if "uncited_claim" in present:
        claims[3] = claim("Claim 3.")
    if "duplicate_citation_id" in present:
        cited.append(cited[1])
    body = await rejected(client, keys, run["run_id"], claims=claims, citations=cited)
    assert body["code"] == present[0]
    expected = {
        "tenant_crossing": {
            "class": "tenant_crossing",
            "citation": 0,
            "citation_id": c0,
            "field": "tenant",
        },
        "ungrounded_citation": {
            "class": "ungrounded_citation",
            "citation": 2,
            "citation_id": c2,
            "field": "document_version",
            "missing": [c2],
            "available": [c0, c1, c2, c3],
        },
        "duplicate_citation_id": {
            "class": "duplicate_citation_id",
            "citation": 4,
            "citation_id": c1,
        },
        "uncited_claim": {"class": "uncited_claim", "claim": 3},
    }
    # Violations come in the order found: citations first, then claims.
    found_order = (
        "tenant_crossing",
        "ungrounded_citation",
        "duplicate_citation_id",
        "uncited_claim",
    )
    assert without_detail(body["violations"]) == [
        expected[kind] for kind in found_order if kind in present
    ]


# ---------------------------------------------------------------------------------------------
# Runs that are not there


async def test_unknown_run_and_another_tenants_run_are_the_same_404(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    theirs = await policy_run(client, keys, tenant="globex")
    answer = {
        "claims": [claim("A.", ids(theirs)[0])],
        "citations": theirs["citations"][:1],
        "refusal": False,
    }
    responses = [
        await client.post(f"/v1/runs/{run_id}/answers", json=answer, headers=keys.headers("agent"))
        for run_id in (theirs["run_id"], "run_does_not_exist")
    ]
    for response in responses:
        assert response.status_code == 404
        assert response.headers["content-type"] == PROBLEM
        assert response.json()["code"] == "not_found"
    assert responses[0].json() == responses[1].json()
    assert await verification_rows(connection, run_id=theirs["run_id"]) == []
    assert await verification_rows(connection, tenant="acme") == []


async def test_answers_need_the_agent_scope(client: httpx.AsyncClient, keys: Keys) -> None:
    run = await policy_run(client, keys)
    answer = {"claims": [], "citations": [], "refusal": True}
    response = await client.post(
        f"/v1/runs/{run['run_id']}/answers", json=answer, headers=keys.headers("support")
    )
    assert response.status_code == 403
    response = await client.post(f"/v1/runs/{run['run_id']}/answers", json=answer)
    assert response.status_code == 401


# ---------------------------------------------------------------------------------------------
# Every attempt is recorded exactly once


async def test_every_attempt_is_recorded_once_with_what_was_decided(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, _ = ids(run)
    key_id = await key_id_of(connection, keys, "agent", "acme")
    grounded: dict[str, Any] = {
        "claims": [claim("Refunds take 30 days.", c1, c0), claim("返金 🧾.", c2, c1)],
        "citations": run["citations"],
        "refusal": False,
    }
    refused: dict[str, Any] = {"claims": [], "citations": [], "refusal": True}
    bad: dict[str, Any] = {
        "claims": [claim("A.", c0), claim("B.")],
        "citations": [run["citations"][0], run["citations"][0] | {"chunk_id": "zz"}],
        "refusal": False,
    }
    passed = await submit_answer(client, keys, run["run_id"], **grounded)
    declined = await submit_answer(client, keys, run["run_id"], **refused)
    problem = await rejected(client, keys, run["run_id"], **bad)

    rows = await verification_rows(connection, run_id=run["run_id"])
    assert [row["verification_id"] for row in rows] == [
        passed["verification_id"],
        declined["verification_id"],
        problem["verification_id"],
    ]
    common = {"tenant": "acme", "run_id": run["run_id"], "key_id": key_id}
    first, second, third = rows
    assert first | common == first
    assert {k: first[k] for k in ("outcome", "code", "violations", "claim_count")} == {
        "outcome": "grounded",
        "code": None,
        "violations": [],
        "claim_count": 2,
    }
    assert first["claims"] == grounded["claims"]
    assert first["provenance"] == [c1, c0, c2]
    assert first["citation_count"] == 4
    assert first["answer_sha256"] == answer_sha256(grounded)

    assert second | common == second
    assert (second["outcome"], second["code"], second["claims"], second["provenance"]) == (
        "refused",
        None,
        [],
        [],
    )
    assert (second["claim_count"], second["citation_count"]) == (0, 0)
    assert second["answer_sha256"] == answer_sha256(refused)

    assert third | common == third
    assert (third["outcome"], third["code"]) == ("rejected", "duplicate_citation_id")
    assert third["violations"] == problem["violations"]
    assert [v["class"] for v in third["violations"]] == [
        "ungrounded_citation",
        "duplicate_citation_id",
        "uncited_claim",
    ]
    assert third["claims"] == bad["claims"]
    assert third["provenance"] == [c0]
    assert (third["claim_count"], third["citation_count"]) == (2, 2)
    assert third["answer_sha256"] == answer_sha256(bad)
    assert len({first["answer_sha256"], second["answer_sha256"], third["answer_sha256"]}) == 3


async def test_the_same_answer_twice_is_two_records_with_one_digest(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    answer: dict[str, Any] = {
        "claims": [claim("B.")],
        "citations": run["citations"],
        "refusal": False,
    }
    first = await rejected(client, keys, run["run_id"], **answer)
    second = await rejected(client, keys, run["run_id"], **answer)
    assert first["verification_id"] != second["verification_id"]
    rows = await verification_rows(connection, run_id=run["run_id"])
    assert [r["verification_id"] for r in rows] == [
        first["verification_id"],
        second["verification_id"],
    ]
    assert rows[0]["answer_sha256"] == rows[1]["answer_sha256"] == answer_sha256(answer)


async def test_digest_writes_small_scores_as_the_canonical_form_does(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    await register_version(client, keys)
    results = [
        result | {"score": score, "branches": {"vector": score / 3, "bm25": 12.5}}
        for result, score in zip(
            results_for(policy_chunks()), (1e-05, 2.5e-07, 1e-10, 1e17), strict=True
        )
    ]
    run = await record_run(client, keys, results=results)
    answer = {"claims": [claim("A.", *ids(run))], "citations": run["citations"]}

    body = await submit_answer(client, keys, run["run_id"], **answer)

    [row] = await verification_rows(connection, verification_id=body["verification_id"])
    assert row["answer_sha256"] == answer_sha256(answer)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_answer_with_a_non_finite_score_is_a_validation_error_and_is_not_recorded(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection, literal: str
) -> None:
    run = await policy_run(client, keys)
    citations = [run["citations"][0] | {"score": 0.125}]
    content = json.dumps({"claims": [claim("A.", ids(run)[0])], "citations": citations})

    response = await client.post(
        f"/v1/runs/{run['run_id']}/answers",
        content=content.replace("0.125", literal).encode(),
        headers=keys.headers("agent") | {"content-type": "application/json"},
    )

    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "validation_error"
    assert [e["loc"] for e in body["errors"]] == [["body", "citations", 0, "score"]]
    assert await verification_rows(connection, run_id=run["run_id"]) == []


async def test_record_keeps_claims_and_ids_never_the_submitted_citations(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    c0 = ids(run)[0]
    passed = await submit_answer(
        client, keys, run["run_id"], claims=[claim("A.", c0)], citations=run["citations"]
    )
    [row] = await verification_rows(connection, verification_id=passed["verification_id"])
    stored = json.dumps({k: v for k, v in row.items() if k != "created_at"}, default=str)
    assert run["citations"][0]["span_sha256"] not in stored
    assert "document_version" not in stored
    assert row["claims"] == [{"text": "A.", "citation_ids": [c0]}]


# ---------------------------------------------------------------------------------------------
# Reading a verification back


async def test_recorded_verification_reads_back_with_each_claims_sources(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    run = await policy_run(client, keys)
    c0, c1, c2, _ = ids(run)
    by_id = {c["citation_id"]: c for c in run["citations"]}
    claims = [claim("Refunds take 30 days.", c2, c0), claim("返金 🧾.", c1)]
    passed = await submit_answer(
        client, keys, run["run_id"], claims=claims, citations=run["citations"]
    )
    response = await client.get(
        f"/v1/answers/{passed['verification_id']}", headers=keys.headers("support")
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert {k: body[k] for k in ("verification_id", "run_id", "tenant", "outcome", "code")} == {
        "verification_id": passed["verification_id"],
        "run_id": run["run_id"],
        "tenant": "acme",
        "outcome": "grounded",
        "code": None,
    }
    assert body["key_id"] == await key_id_of(connection, keys, "agent", "acme")
    assert body["text"] == "Refunds take 30 days. 返金 🧾."
    assert body["provenance"] == [c2, c0, c1]
    assert body["violations"] == []
    assert (body["claim_count"], body["citation_count"]) == (2, 4)
    assert body["answer_sha256"] == answer_sha256(
        {"claims": claims, "citations": run["citations"], "refusal": False}
    )
    assert [
        {"text": c["text"], "citation_ids": c["citation_ids"], "sources": c["sources"]}
        for c in body["claims"]
    ] == [
        {**claims[0], "sources": [by_id[c2], by_id[c0]]},
        {**claims[1], "sources": [by_id[c1]]},
    ]


async def test_rejected_verification_reads_back_with_its_code_and_violations(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    c0 = ids(run)[0]
    claims = [claim("A.", c0, "cit_invented"), claim("B.")]
    problem = await rejected(client, keys, run["run_id"], claims=claims, citations=run["citations"])
    response = await client.get(
        f"/v1/answers/{problem['verification_id']}", headers=keys.headers("agent")
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["outcome"], body["code"]) == ("rejected", "ungrounded_citation")
    assert body["violations"] == problem["violations"]
    assert body["provenance"] == [c0, "cit_invented"]
    # Only what the run issued is a source; an invented id is listed but resolves to nothing.
    assert [
        (c["citation_ids"], [s["citation_id"] for s in c["sources"]]) for c in body["claims"]
    ] == [
        ([c0, "cit_invented"], [c0]),
        ([], []),
    ]


async def test_verification_of_another_tenant_is_not_found(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    run = await policy_run(client, keys)
    passed = await submit_answer(
        client, keys, run["run_id"], claims=[claim("A.", ids(run)[0])], citations=run["citations"]
    )
    theirs = await client.get(
        f"/v1/answers/{passed['verification_id']}", headers=keys.headers("support", tenant="globex")
    )
    unknown = await client.get("/v1/answers/ver_does_not_exist", headers=keys.headers("support"))
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json() == unknown.json()
    assert theirs.json()["code"] == "not_found"


# ---------------------------------------------------------------------------------------------
# Statements per verification do not grow with the answer


async def test_verification_uses_the_same_statements_whatever_the_answer_size(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    text_, chunks = many_chunks(60)
    await register_version(
        client, keys, document_id="rules", version="v1", text=text_, chunks=chunks
    )
    run = await record_run(
        client, keys, results=results_for(chunks, document_id="rules", version="v1")
    )
    assert len(run["citations"]) == 60
    cited = run["citations"]

    async def verify(claims: int, citations: int, *, expect: int = 200) -> list[str]:
        answer: dict[str, Any] = {
            "claims": [
                claim(f"Rule {i}.", cited[i % citations]["citation_id"], cited[0]["citation_id"])
                for i in range(claims)
            ],
            "citations": cited[:citations],
            "refusal": False,
        }
        if expect == 422:
            answer["claims"].append(claim("Uncited."))
        async with statements_sent(connection) as statements:
            response = await client.post(
                f"/v1/runs/{run['run_id']}/answers", json=answer, headers=keys.headers("agent")
            )
        assert response.status_code == expect, response.text
        return sorted(re.sub(r"sa_savepoint_\d+", "sa_savepoint", s) for s in statements)

    small = await verify(1, 1)
    assert small == await verify(50, 60)
    [record] = [s for s in small if "INSERT INTO verifications" in s]
    # The record, the citation ids it rests on and its audit entry: one statement.
    assert "INSERT INTO verification_citations" in record
    assert "INSERT INTO audit_entries" in record
    rejected_small = await verify(1, 1, expect=422)
    assert rejected_small == await verify(50, 60, expect=422)
    # A rejection's record is committed (its savepoint released), not rolled back.
    assert any(s.startswith("RELEASE SAVEPOINT") for s in rejected_small)
    assert not any(s.startswith("ROLLBACK") for s in rejected_small)
    assert rejected_small == small


async def test_an_answer_body_is_decoded_once_by_the_fast_decoder(
    client: httpx.AsyncClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await policy_run(client, keys)
    decoded: list[bytes] = []
    decode = bodies.loads

    def counting(body: bytes) -> Any:
        decoded.append(body)
        return decode(body)

    monkeypatch.setattr(bodies, "loads", counting)
    answer = {"claims": [claim("A.", ids(run)[0])], "citations": run["citations"]}
    # Its limits, its key's claim, its validation and the response kept with the key all read it.
    response = await client.post(
        f"/v1/runs/{run['run_id']}/answers",
        json=answer,
        headers=keys.headers("agent") | {"Idempotency-Key": "decoded-once"},
    )

    assert response.status_code == 200, response.text
    assert [json.loads(body) for body in decoded] == [answer]


async def test_a_run_is_read_for_its_check_as_the_citations_it_stores(committed: Committed) -> None:
    # `_issued_pin` unpacks the statement's columns by position and pins them without building
    # each `Citation`: the check must read what the model holds, field for field and in order.
    # The policy's offsets differ in code points, UTF-8 and UTF-16, so no two columns read alike.
    await register_version(committed.client, committed.keys)
    run = await record_run(committed.client, committed.keys)
    async with committed.owner.connect() as connection:
        driver = (await connection.get_raw_connection()).driver_connection
        assert driver is not None
        rows = await driver.fetch(answers._ISSUED, "acme", run["run_id"])
        stored = await driver.fetch(
            "SELECT * FROM citations WHERE tenant = $1 AND run_id = $2 ORDER BY ordinal",
            "acme",
            run["run_id"],
        )
    issued = [citations.from_row(row) for row in stored]
    assert len(issued) == len(run["citations"]) == 4
    assert [answers._issued_pin(row) for row in rows] == [
        (c.citation_id, c.document_id, c.document_version, c.pinned, c.span_sha256) for c in issued
    ]
