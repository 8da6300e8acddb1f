"""Right-to-erasure: tombstones everywhere a citation is read, and no text left behind.

The scan tests look for the erased text in every text-like column of every table in the public
schema, discovered from the catalog, so a table added later is covered without being named here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    create_async_engine,
)
from sqlalchemy.pool import NullPool
from sqlalchemy.types import LargeBinary, Text

from app.access.service import Principal
from app.config import Settings
from app.db import async_url
from app.documents import service as documents
from app.documents.schemas import ErasureCreate
from tests.conftest import Committed
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


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def _span(value: str, citation: dict[str, Any]) -> str:
    return value[citation["span"]["start"] : citation["span"]["end"]]


def _sentence_chunks(value: str, prefix: str = "s") -> list[dict[str, Any]]:
    """One chunk per sentence (to '.' or '。' and the space after it), covering the text."""
    chunks: list[dict[str, Any]] = []
    start = 0
    for index, char in enumerate(value):
        if char in ".。" and value[index + 1 : index + 2] in ("", " "):
            end = min(index + 2, len(value))
            chunks.append({"chunk_id": f"{prefix}{len(chunks) + 1}", "start": start, "end": end})
            start = end
    if value[start:].strip():
        chunks.append({"chunk_id": f"{prefix}{len(chunks) + 1}", "start": start, "end": len(value)})
    return chunks


async def _get(client: httpx.AsyncClient, keys: Keys, path: str) -> httpx.Response:
    return await client.get(path, headers=keys.headers("support"))


async def _excerpt(client: httpx.AsyncClient, keys: Keys, citation_id: str) -> dict[str, Any]:
    response = await _get(client, keys, f"/v1/citations/{citation_id}/excerpt")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _resolve(client: httpx.AsyncClient, keys: Keys, ids: list[str]) -> list[dict[str, Any]]:
    response = await client.post(
        "/v1/citations/resolve", json={"citation_ids": ids}, headers=keys.headers("support")
    )
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


async def _answer(
    client: httpx.AsyncClient,
    keys: Keys,
    run_id: str,
    *,
    claims: list[dict[str, Any]],
    citations: list[dict[str, Any]],
    expect: int,
) -> dict[str, Any]:
    response = await client.post(
        f"/v1/runs/{run_id}/answers",
        json={"claims": claims, "citations": citations, "refusal": False},
        headers=keys.headers("agent"),
    )
    assert response.status_code == expect, response.text
    body: dict[str, Any] = response.json()
    return body


async def _remember(client: httpx.AsyncClient, keys: Keys, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/memory", json=body, headers=keys.headers("agent"))
    assert response.status_code == 201, response.text
    record: dict[str, Any] = response.json()
    return record


def _assert_tombstone(
    entry: dict[str, Any], citation: dict[str, Any], erasure: dict[str, Any]
) -> None:
    assert entry["citation_id"] == citation["citation_id"]
    assert entry["erased"] is True
    assert entry["text"] is None
    assert entry["erased_at"] == erasure["erased_at"]
    assert entry["request_ref"] == erasure["request_ref"]
    assert entry["document_id"] == citation["document_id"]
    assert entry["document_version"] == citation["document_version"]
    assert entry["span"] == citation["span"]
    assert entry["locator"] == citation["locator"]
    assert "span_sha256" not in entry


# --- the erasure itself -----------------------------------------------------------------------


async def test_erasing_a_document_erases_every_version_and_answers_the_erasure(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    await register_version(client, keys, version="v2")

    erasure = await erase_document(client, keys, reason="data subject asked", request_ref="DSR-1")

    assert erasure["erasure_id"]
    assert erasure["document_id"] == DOC
    assert erasure["versions"] == ["v1", "v2"]
    assert erasure["request_ref"] == "DSR-1"
    assert erasure["erased_at"]
    document = (await client.get(f"/v1/documents/{DOC}", headers=keys.headers("ingest"))).json()
    assert [v["version"] for v in document["versions"]] == ["v1", "v2"]
    for version in document["versions"]:
        assert version["erased_at"] == erasure["erased_at"]
        assert version["sha256"] is None
        assert version["chunk_count"] == len(policy_chunks())


async def test_erasing_again_answers_the_same_erasure_with_200(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)

    first = await erase_document(client, keys, request_ref="DSR-1")
    again = await erase_document(client, keys, request_ref="DSR-2", reason="asked twice")
    named = await erase_document(client, keys, versions=["2026-11-03"], request_ref="DSR-3")

    assert again == first
    assert named == first
    exposition = (await client.get("/metrics")).text
    assert "grounding_erasures_total 1.0" in exposition.splitlines()


async def test_erasing_named_versions_leaves_the_others_live(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    for version in ("v1", "v2", "v3"):
        await register_version(client, keys, version=version)
    results = [
        r
        for version in ("v1", "v2", "v3")
        for r in results_for(policy_chunks()[:1], version=version)
    ]
    v1, v2, v3 = (await record_run(client, keys, results=results))["citations"]

    first = await erase_document(client, keys, versions=["v1", "v3"], request_ref="DSR-1")

    assert first["versions"] == ["v1", "v3"]
    [gone_1, live, gone_3] = await _resolve(
        client, keys, [v1["citation_id"], v2["citation_id"], v3["citation_id"]]
    )
    _assert_tombstone(gone_1, v1, first)
    _assert_tombstone(gone_3, v3, first)
    assert live["status"] == "excerpt"
    assert live["text"] == _span(POLICY_TEXT, v2)
    assert live["superseded_by"] is None

    # Erasing the rest erases only what is left, in an erasure of its own.
    rest = await erase_document(client, keys, request_ref="DSR-2")
    assert rest["versions"] == ["v2"]
    assert rest["erasure_id"] != first["erasure_id"]
    _assert_tombstone((await _resolve(client, keys, [v2["citation_id"]]))[0], v2, rest)
    # Naming only versions erased before answers the erasure that erased them.
    assert await erase_document(client, keys, versions=["v1"]) == first


async def test_erasing_an_unknown_document_or_version_is_404_and_erases_nothing(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = (await record_run(client, keys))["citations"]

    missing_document = await erase_document(client, keys, document_id="no-such-doc", expect=404)
    missing_version = await erase_document(
        client, keys, versions=["2026-11-03", "1999-01-01"], expect=404
    )
    only_missing = await erase_document(client, keys, versions=["1999-01-01"], expect=404)

    for problem in (missing_document, missing_version, only_missing):
        assert problem["code"] == "not_found"
    assert (await _excerpt(client, keys, cited["citation_id"]))["text"] == _span(POLICY_TEXT, cited)
    document = (await client.get(f"/v1/documents/{DOC}", headers=keys.headers("ingest"))).json()
    assert document["versions"][0]["erased_at"] is None


async def test_another_tenant_cannot_erase_or_see_a_document(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    [cited, *_] = (await record_run(client, keys))["citations"]

    theirs = await erase_document(client, keys, tenant="globex", expect=404)
    nobodys = await erase_document(client, keys, tenant="globex", document_id="nope", expect=404)

    assert theirs == nobodys
    assert (await _excerpt(client, keys, cited["citation_id"]))["erased"] is False


@pytest.mark.parametrize("scope", ["agent", "support", "audit"])
async def test_erasure_needs_the_ingest_scope(
    scope: str, client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    response = await client.post(
        f"/v1/documents/{DOC}/erase",
        json={"reason": "r", "request_ref": "DSR-1"},
        headers=keys.headers(scope),
    )
    assert response.status_code == 403
    unauthenticated = await client.post(
        f"/v1/documents/{DOC}/erase", json={"reason": "r", "request_ref": "DSR-1"}
    )
    assert unauthenticated.status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {"request_ref": "DSR-1"},
        {"reason": "r"},
        {"reason": "", "request_ref": "DSR-1"},
        {"reason": "r", "request_ref": "DSR-1", "versions": []},
        {"reason": "r", "request_ref": "DSR-1", "extra": True},
    ],
)
async def test_an_erasure_request_needs_a_reason_a_reference_and_real_versions(
    body: dict[str, Any], client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    response = await client.post(
        f"/v1/documents/{DOC}/erase", json=body, headers=keys.headers("ingest")
    )
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


# --- after the erasure ------------------------------------------------------------------------


async def test_every_citation_into_an_erased_version_reads_as_a_tombstone(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    cited = (await record_run(client, keys))["citations"]
    ids = [c["citation_id"] for c in cited]
    memory = await _remember(client, keys, text="Refund timing noted.", citation_ids=ids[:2])

    erasure = await erase_document(client, keys, request_ref="DSR-9")

    for citation in cited:
        _assert_tombstone(await _excerpt(client, keys, citation["citation_id"]), citation, erasure)
    for entry, citation in zip(await _resolve(client, keys, ids), cited, strict=True):
        assert entry["status"] == "tombstone"
        _assert_tombstone(entry, citation, erasure)
    record = (await _get(client, keys, f"/v1/memory/{memory['memory_id']}")).json()
    assert record["text"] == "Refund timing noted."
    assert record["citation_ids"] == ids[:2]
    assert [e["status"] for e in record["citations"]] == ["tombstone", "tombstone"]
    for entry, citation in zip(record["citations"], cited[:2], strict=True):
        _assert_tombstone(entry, citation, erasure)


async def test_a_memory_record_says_which_of_its_sources_are_erased(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    await register_version(client, keys, document_id="kept")
    results = [
        *results_for(policy_chunks()[:1]),
        *results_for(policy_chunks()[:1], document_id="kept"),
    ]
    erased, kept = (await record_run(client, keys, results=results))["citations"]
    memory = await _remember(
        client, keys, text="Two sources.", citation_ids=[kept["citation_id"], erased["citation_id"]]
    )

    erasure = await erase_document(client, keys)

    record = (await _get(client, keys, f"/v1/memory/{memory['memory_id']}")).json()
    live, tombstone = record["citations"]
    assert live["status"] == "excerpt"
    assert live["erased"] is False
    assert live["text"] == _span(POLICY_TEXT, kept)
    assert tombstone["status"] == "tombstone"
    _assert_tombstone(tombstone, erased, erasure)


async def test_runs_verifications_and_memory_stay_readable_without_plain_hashes(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys)
    run = await record_run(client, keys)
    cited = run["citations"]
    verification = await _answer(
        client,
        keys,
        run["run_id"],
        claims=[{"text": "Refunds are quick.", "citation_ids": [cited[0]["citation_id"]]}],
        citations=cited[:1],
        expect=200,
    )
    memory = await _remember(
        client, keys, text="Quick refunds.", verification_id=verification["verification_id"]
    )

    await erase_document(client, keys)

    read_run = await _get(client, keys, f"/v1/runs/{run['run_id']}")
    read_answer = await _get(client, keys, f"/v1/answers/{verification['verification_id']}")
    read_memory = await _get(client, keys, f"/v1/memory/{memory['memory_id']}")
    read_citation = await _get(client, keys, f"/v1/citations/{cited[0]['citation_id']}")
    for response in (read_run, read_answer, read_memory, read_citation):
        assert response.status_code == 200, response.text
    assert [c["citation_id"] for c in read_run.json()["citations"]] == [
        c["citation_id"] for c in cited
    ]
    assert all(c["span_sha256"] is None for c in read_run.json()["citations"])
    assert read_citation.json()["span_sha256"] is None
    answer = read_answer.json()
    assert answer["outcome"] == "grounded"
    assert answer["claims"][0]["text"] == "Refunds are quick."
    assert answer["claims"][0]["citation_ids"] == [cited[0]["citation_id"]]
    assert all(s["span_sha256"] is None for s in answer["claims"][0]["sources"])
    assert read_memory.json()["citations"][0]["status"] == "tombstone"


async def test_a_new_run_citing_an_erased_version_is_a_configuration_error(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    await register_version(client, keys, version="v2")
    await erase_document(client, keys, versions=["v1"])

    response = await client.post(
        "/v1/runs",
        json={
            "results": [
                *results_for(policy_chunks()[:1], version="v2"),
                *results_for(policy_chunks()[:1], version="v1"),
            ]
        },
        headers=keys.headers("agent"),
    )

    assert response.status_code == 422
    problem = response.json()
    assert problem["code"] == "configuration_error"
    assert problem["errors"] == [{"index": 1, "field": "version", "problem": "erased_version"}]
    # Nothing was issued for the good result either.
    assert "citations" not in problem


async def test_an_erased_version_cannot_be_registered_again_but_a_new_one_can(
    client: httpx.AsyncClient, keys: Keys
) -> None:
    await register_version(client, keys, version="v1")
    await erase_document(client, keys)

    same = await register_version(client, keys, version="v1", expect=409)
    changed = await register_version(
        client, keys, version="v1", text="Something else entirely.", chunks=[], expect=409
    )
    assert same["code"] == changed["code"] == "version_conflict"
    assert POLICY_TEXT[:12] not in json.dumps(same, ensure_ascii=False)

    await register_version(client, keys, version="v2")
    [cited, *_] = (
        await record_run(client, keys, results=results_for(policy_chunks(), version="v2"))
    )["citations"]
    excerpt = await _excerpt(client, keys, cited["citation_id"])
    assert excerpt["text"] == _span(POLICY_TEXT, cited)
    assert excerpt["erased"] is False


# --- the scan: no text and no plain hash left in any column -----------------------------------

# Every column of every table and materialized view in `public` whose values can hold
# characters: string types, json, arrays (of anything: their text form is searched) and bytea.
_COLUMNS = text(
    """
    SELECT c.relname AS table_name, a.attname AS column_name,
           CASE WHEN t.typname IN ('json', 'jsonb') THEN 'json'
                WHEN t.typname = 'bytea' THEN 'bytea'
                WHEN t.typcategory = 'A' THEN 'array'
                ELSE 'string' END AS kind,
           has_table_privilege(c.oid, 'SELECT') AS readable
      FROM pg_attribute a
      JOIN pg_class c ON c.oid = a.attrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_type d ON d.oid = a.atttypid
      JOIN pg_type t ON t.oid = CASE WHEN d.typtype = 'd' THEN d.typbasetype ELSE d.oid END
     WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'm')
       AND a.attnum > 0 AND NOT a.attisdropped
       AND (t.typcategory IN ('S', 'A') OR t.typname IN ('json', 'jsonb', 'bytea'))
     ORDER BY c.relname, a.attnum
    """
)

_HAYSTACK = {
    "string": "lower({col}::text)",
    "array": "lower(array_to_string({col}, chr(31)))",
    # Both the JSON text and its string values unescaped, so an escaped copy is found too.
    "json": (
        "lower({col}::text || chr(31) || coalesce((SELECT string_agg(v #>> '{{}}', chr(31))"
        " FROM jsonb_path_query({col}::jsonb, 'strict $.**') AS v"
        " WHERE jsonb_typeof(v) = 'string'), ''))"
    ),
}


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Needles:
    """What must not remain, by a label that names it without quoting it."""

    texts: dict[str, str]
    blobs: dict[str, bytes]

    @classmethod
    def of(cls, versions: dict[str, str], chunks: dict[str, str], *, window: int = 12) -> Needles:
        texts: dict[str, str] = {}
        for name, value in versions.items():
            for i in range(len(value) - window + 1):
                texts[f"{name}: characters {i}-{i + window}"] = value[i : i + window]
            texts[f"{name}: sha256"] = _sha256(value)
        for name, value in chunks.items():
            texts[f"{name}: whole text"] = value
            texts[f"{name}: sha256"] = _sha256(value)
        blobs = {label: needle.encode("utf-8") for label, needle in texts.items()}
        for label, needle in list(texts.items()):
            if label.endswith("sha256"):
                blobs[f"{label} (raw digest)"] = bytes.fromhex(needle)
        return cls(texts=texts, blobs=blobs)


async def _scan(connection: AsyncConnection, needles: Needles) -> dict[str, set[str]]:
    """`table.column` -> labels of the needles found in it, over every text-like column."""
    columns = (await connection.execute(_COLUMNS)).all()
    unreadable = sorted({c.table_name for c in columns if not c.readable})
    assert not unreadable, f"the scan cannot read these tables: {unreadable}"
    labels = list(needles.texts)
    blob_labels = list(needles.blobs)
    found: dict[str, set[str]] = {}
    for column in columns:
        col = f"t.{_quoted(column.column_name)}"
        table = _quoted(column.table_name)
        if column.kind == "bytea":
            statement = text(
                f"SELECT DISTINCT n.label FROM {table} AS t,"
                " unnest(:needles, :labels) AS n(needle, label)"
                f" WHERE position(n.needle IN {col}) > 0"
            ).bindparams(
                bindparam("needles", type_=ARRAY(LargeBinary)),
                bindparam("labels", type_=ARRAY(Text)),
            )
            values: dict[str, Any] = {
                "needles": [needles.blobs[label] for label in blob_labels],
                "labels": blob_labels,
            }
        else:
            haystack = _HAYSTACK[column.kind].format(col=col)
            statement = text(
                f"SELECT DISTINCT n.label FROM {table} AS t,"
                f" LATERAL (SELECT {haystack} AS hay) AS h,"
                " unnest(:needles, :labels) AS n(needle, label)"
                " WHERE strpos(h.hay, n.needle) > 0"
            ).bindparams(
                bindparam("needles", type_=ARRAY(Text)), bindparam("labels", type_=ARRAY(Text))
            )
            values = {
                "needles": [needles.texts[label].lower() for label in labels],
                "labels": labels,
            }
        hits = set((await connection.execute(statement, values)).scalars())
        if hits:
            found[f"{column.table_name}.{column.column_name}"] = hits
    return found


def _kinds(found: dict[str, set[str]], where: str) -> set[str]:
    """Which kinds of needle (characters, whole text, sha256) were found in `where`."""
    return {label.split(": ")[1].split(" ")[0] for label in found.get(where, set())}


async def _with_idempotency_key(request: httpx.Request) -> None:
    if request.method == "POST":
        request.headers["Idempotency-Key"] = secrets.token_hex(16)


SUBJECT_V1 = (
    "Ledger of Quillfeather Nordvik-Ashworth: account QX-4417-ZB routes each reimbursement "
    "through the Ostrava annex 🧭 before noon. 帳簿番号は七四一七です。 "
    "Her spouse Ingrid Mørkvedt 👩\u200d🔬 co-signs in cafe\u0301-brown ink. "
)
SUBJECT_V2 = SUBJECT_V1 + "From March the annex moves to Brno-Líšeň, desk 9-Z."
KEEPER = "Unrelated handbook page: parking permits renew every Zwölfmonat at the Vexmoor desk."


async def test_erasure_leaves_no_copy_of_the_text_or_a_plain_hash_in_any_column(
    client: httpx.AsyncClient, keys: Keys, connection: AsyncConnection
) -> None:
    # Every write under an Idempotency-Key: the responses kept for retries are scanned too.
    client.event_hooks["request"].append(_with_idempotency_key)
    subject_chunks = {"v1": _sentence_chunks(SUBJECT_V1), "v2": _sentence_chunks(SUBJECT_V2)}
    for version, value in (("v1", SUBJECT_V1), ("v2", SUBJECT_V2)):
        await register_version(
            client,
            keys,
            document_id="dsr-subject",
            version=version,
            text=value,
            chunks=subject_chunks[version],
            title="Subject ledger",
        )
    keeper_chunks = _sentence_chunks(KEEPER, prefix="k")
    await register_version(client, keys, document_id="keeper", text=KEEPER, chunks=keeper_chunks)
    run = await record_run(
        client,
        keys,
        results=[
            *results_for(subject_chunks["v1"], document_id="dsr-subject", version="v1"),
            *results_for(subject_chunks["v2"], document_id="dsr-subject", version="v2"),
            *results_for(keeper_chunks, document_id="keeper"),
        ],
    )
    cited = run["citations"]
    subject = [c for c in cited if c["document_id"] == "dsr-subject"]
    keeper = [c for c in cited if c["document_id"] == "keeper"]
    first, second = subject[0], subject[1]
    first_text = _span(SUBJECT_V1, first)

    # Verify answers, passing and failing; the claims do not quote the document, but the
    # quotes and the carried citations (with their plain hashes) are its text and hashes.
    grounded = await _answer(
        client,
        keys,
        run["run_id"],
        claims=[
            {
                "text": "The account is handled by a regional office.",
                "citation_ids": [first["citation_id"], keeper[0]["citation_id"]],
                "quotes": [{"citation_id": first["citation_id"], "text": first_text[10:40]}],
            }
        ],
        citations=[first, keeper[0]],
        expect=200,
    )
    rejections = [
        await _answer(
            client,
            keys,
            run["run_id"],
            claims=[{"text": "An unsupported statement.", "citation_ids": ["cit_not_carried"]}],
            citations=[first],
            expect=422,
        ),
        await _answer(
            client,
            keys,
            run["run_id"],
            claims=[
                {
                    "text": "A misquoted statement.",
                    "citation_ids": [first["citation_id"]],
                    "quotes": [
                        {"citation_id": first["citation_id"], "text": _span(SUBJECT_V1, second)}
                    ],
                }
            ],
            citations=[first],
            expect=422,
        ),
        await _answer(
            client,
            keys,
            run["run_id"],
            claims=[{"text": "A tampered source.", "citation_ids": [first["citation_id"]]}],
            citations=[{**first, "span_sha256": _sha256(SUBJECT_V1)}],
            expect=422,
        ),
    ]
    memories = [
        await _remember(
            client,
            keys,
            text="Regional routing applies.",
            verification_id=grounded["verification_id"],
        ),
        await _remember(
            client,
            keys,
            text="Two sources on routing.",
            citation_ids=[second["citation_id"], keeper[0]["citation_id"]],
        ),
    ]

    def reads() -> list[tuple[str, str, dict[str, Any] | None]]:
        ids = [c["citation_id"] for c in cited]
        return [
            ("GET", f"/v1/runs/{run['run_id']}", None),
            ("GET", f"/v1/answers/{grounded['verification_id']}", None),
            *[("GET", f"/v1/answers/{r['verification_id']}", None) for r in rejections],
            *[("GET", f"/v1/memory/{m['memory_id']}", None) for m in memories],
            *[("GET", f"/v1/citations/{cid}", None) for cid in ids],
            *[("GET", f"/v1/citations/{cid}/excerpt", None) for cid in ids],
            ("POST", "/v1/citations/resolve", {"citation_ids": ids}),
        ]

    async def read_everything() -> str:
        bodies = []
        for method, path, body in reads():
            response = await client.request(method, path, json=body, headers=keys.headers("admin"))
            assert response.status_code == 200, (path, response.status_code)
            bodies.append(json.dumps(response.json(), ensure_ascii=False))
        document = await client.get("/v1/documents/dsr-subject", headers=keys.headers("ingest"))
        bodies.append(json.dumps(document.json(), ensure_ascii=False))
        return "\n".join(bodies).lower()

    all_chunks = {
        f"{version} {chunk['chunk_id']}": value[chunk["start"] : chunk["end"]]
        for version, value in (("v1", SUBJECT_V1), ("v2", SUBJECT_V2))
        for chunk in subject_chunks[version]
    }
    erased = Needles.of({"v1": SUBJECT_V1, "v2": SUBJECT_V2}, all_chunks)
    kept = Needles.of(
        {"keeper": KEEPER},
        {c["chunk_id"]: KEEPER[c["start"] : c["end"]] for c in keeper_chunks},
    )
    await connection.execute(text("SELECT set_config('app.tenant', 'acme', true)"))

    # Before: the scan finds the text and every kind of plain hash, so it cannot pass vacuously.
    before = await _scan(connection, erased)
    assert {"characters", "whole", "sha256"} <= _kinds(before, "chunks.text") | _kinds(
        before, "chunks.span_sha256"
    )
    assert "characters" in _kinds(before, "document_versions.text")
    assert "sha256" in _kinds(before, "document_versions.sha256")
    assert "sha256" in _kinds(before, "citations.span_sha256")
    # A kept run holds its citations' plain hashes; a kept verification, the claims' quotes.
    assert {"characters", "sha256"} <= _kinds(before, "idempotency_keys.body")
    responses_before = await read_everything()
    assert first_text[:12].lower() in responses_before

    erasure = await erase_document(
        client, keys, document_id="dsr-subject", request_ref="DSR-2041", reason="Art. 17 request"
    )
    assert erasure["versions"] == ["v1", "v2"]
    await connection.execute(text("SELECT set_config('app.tenant', 'acme', true)"))

    after = await _scan(connection, erased)
    assert after == {}, f"erased text or plain hashes remain in: {sorted(after)}"
    # The scan still sees what was not erased.
    still = await _scan(connection, kept)
    assert "characters" in _kinds(still, "document_versions.text")
    assert "whole" in _kinds(still, "chunks.text")
    assert "sha256" in _kinds(still, "citations.span_sha256")

    responses_after = await read_everything()
    leaked = [label for label, needle in erased.texts.items() if needle.lower() in responses_after]
    assert leaked == [], f"responses still carry: {leaked[:5]}"
    # The keyed hashes stay, their keys do not.
    rows = await connection.execute(
        text(
            "SELECT (SELECT count(*) FROM citations WHERE document_id = 'dsr-subject'"
            "         AND span_hmac IS NOT NULL),"
            "       (SELECT count(*) FROM version_keys WHERE document_id = 'dsr-subject')"
        )
    )
    assert tuple(rows.one()) == (len(subject), 0)


# --- vacuum: the dead rows that still hold the text -------------------------------------------


async def test_vacuum_after_erasure_vacuums_each_table_an_erasure_rewrites(
    settings: Settings,
) -> None:
    owner = create_async_engine(async_url(str(settings.database_url)), poolclass=NullPool)
    counts = text(
        "SELECT relname, vacuum_count FROM pg_stat_user_tables"
        " WHERE relname IN ('document_versions', 'chunks', 'citations', 'version_keys')"
    )
    try:
        async with owner.connect() as connection:
            before = {r.relname: r.vacuum_count for r in await connection.execute(counts)}
        await documents.vacuum_after_erasure(settings)
        async with owner.connect() as connection:
            after = {r.relname: r.vacuum_count for r in await connection.execute(counts)}
    finally:
        await owner.dispose()

    assert set(before) == {"document_versions", "chunks", "citations", "version_keys"}
    assert {table: after[table] - before[table] for table in before} == dict.fromkeys(before, 1)


async def test_vacuum_after_erasure_never_raises_and_logs_only_table_names(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = settings.model_copy(
        update={
            "database_url": str(
                make_url(str(settings.database_url)).set(database="grounding_no_such_database")
            )
        }
    )
    with caplog.at_level(logging.WARNING, logger="app.documents.service"):
        await documents.vacuum_after_erasure(unreachable)
        await documents.vacuum_after_erasure(settings, tables=("no_such_table", "chunks"))

    messages = [r.getMessage() for r in caplog.records if r.name == "app.documents.service"]
    assert len(messages) == 2
    assert "no connection" in messages[0]
    assert "no_such_table" in messages[1]
    assert "grounding_no_such_database" not in " ".join(messages)
    assert all(r.levelno == logging.WARNING for r in caplog.records)


# Every relation whose rows can hold a copy: the public tables, their TOAST tables, and the
# column statistics ANALYZE samples values into; then every B-tree index on any of them.
_RELATIONS = text(
    """
    WITH tables AS (
        SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'm')
        UNION SELECT 'pg_catalog.pg_statistic'::regclass::oid
    ), heaps AS (
        SELECT oid FROM tables
        UNION SELECT reltoastrelid FROM pg_class WHERE oid IN (SELECT oid FROM tables)
           AND reltoastrelid <> 0
    )
    SELECT oid::regclass::text AS relation, 'heap' AS kind,
           pg_relation_size(oid) / current_setting('block_size')::int AS blocks
      FROM heaps
    UNION ALL
    SELECT i.indexrelid::regclass::text, 'btree',
           pg_relation_size(i.indexrelid) / current_setting('block_size')::int
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
     WHERE i.indrelid IN (SELECT oid FROM heaps) AND am.amname = 'btree'
    """
)

# Each row version on a page, dead ones included until VACUUM prunes them; for a B-tree, each
# index entry (block 0 is its metapage).
_ITEMS = {
    "heap": "SELECT t_data FROM heap_page_items(get_raw_page(:relation, :block))",
    "btree": "SELECT decode(replace(data, ' ', ''), 'hex') FROM bt_page_items(:relation, :block)",
}


async def _rows_holding(owner: AsyncEngine, needles: Needles) -> dict[str, set[str]]:
    """Relation -> labels of the needles some row version or index entry of it holds."""
    found: dict[str, set[str]] = {}
    async with owner.connect() as connection:
        relations = (await connection.execute(_RELATIONS)).all()
        for relation in relations:
            for block in range(1 if relation.kind == "btree" else 0, relation.blocks):
                items = await connection.execute(
                    text(_ITEMS[relation.kind]), {"relation": relation.relation, "block": block}
                )
                for (data,) in items:
                    hits = {label for label, blob in needles.blobs.items() if data and blob in data}
                    if hits:
                        found.setdefault(relation.relation, set()).update(hits)
    return found


async def _owner_autocommit(owner: AsyncEngine, statement: str) -> None:
    async with owner.connect() as connection:
        autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.execute(text(statement))


QUIET = "Quiet file: Oswin Threlkeld-Marrow 🦉 keeps locker 88-QF at the Harrowgate depot. 保管庫。"
LOUD = "Loud file: Petra Zanussi-Orme 🎺 signs for parcel 51-LX at the Kettlewick kiosk. 小包。"


def _needles_of(value: str, chunks: list[dict[str, Any]]) -> Needles:
    return Needles.of(
        {"text": value}, {c["chunk_id"]: value[c["start"] : c["end"]] for c in chunks}
    )


async def test_the_vacuum_after_an_erasure_leaves_no_row_version_holding_the_text(
    committed: Committed,
) -> None:
    client, keys, owner = committed.client, committed.keys, committed.owner
    try:
        await _owner_autocommit(owner, "CREATE EXTENSION IF NOT EXISTS pageinspect")
    except Exception:
        pytest.skip("pageinspect is not available on this server (or not to this role)")
    needles = {}
    for document_id, value in (("quiet", QUIET), ("loud", LOUD)):
        chunks = _sentence_chunks(value)
        needles[document_id] = _needles_of(value, chunks)
        await register_version(
            client, keys, document_id=document_id, version="v1", text=value, chunks=chunks
        )
        await record_run(
            client, keys, results=results_for(chunks, document_id=document_id, version="v1")
        )
    # As autovacuum's ANALYZE would: sampled values of every column land in pg_statistic.
    await _owner_autocommit(owner, "ANALYZE")
    for found in (
        await _rows_holding(owner, needles["quiet"]),
        await _rows_holding(owner, needles["loud"]),
    ):
        assert {"document_versions", "chunks", "citations", "pg_statistic"} <= set(found)

    # The service's erasure alone: logically gone, physically still there, in dead rows.
    async with committed.sessionmaker() as session, session.begin():
        await session.execute(text("SELECT set_config('app.tenant', 'acme', true)"))
        await documents.erase(
            session,
            principal=Principal(tenant="acme", key_id="key_test", scopes=frozenset({"ingest"})),
            document_id="quiet",
            body=ErasureCreate(reason="r", request_ref="DSR-quiet"),
        )
    dead = await _rows_holding(owner, needles["quiet"])
    assert {"document_versions", "chunks", "citations"} <= set(dead)

    # Through the API, the vacuum runs once the erasure has committed: it reclaims both.
    await erase_document(client, keys, document_id="loud", request_ref="DSR-loud")

    for document_id in ("quiet", "loud"):
        remaining = await _rows_holding(owner, needles[document_id])
        assert remaining == {}, f"row versions still holding {document_id}: {sorted(remaining)}"
