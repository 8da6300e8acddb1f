"""Telemetry that never carries document text: traces, metrics and logs of every kind of request.

Each flow runs with distinctive texts (document, claims, query, memory, erasure reason, a query
string) and then reads everything the service recorded: every finished span (as the exporter
would send it), the app's Prometheus registry, and every log record at the levels `grounding
serve` configures. None may hold any 8-character window of those texts. The known leaks are
tested one by one beside it: validation problems, database error messages, the embedded
server's own log, problems answered for database errors.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import secrets
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from hypothesis import example, given
from hypothesis import strategies as st
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from app.config import Settings
from app.logs import JsonFormatter, JsonLineHandler, log_fields, logging_config, timestamp
from app.main import create_app
from app.telemetry import otlp_tracer_provider
from tests.conftest import serving
from tests.factories import Keys, claim

WINDOW = 8

DOCUMENT_ID = "otel-probe"
VERSION = "v1"
# Words no route, id, attribute or log field contains, with emoji, combining marks and CJK.
DOCUMENT_TEXT = (
    "Zorbulant parcels glide home inside seventeen moons. "
    "Quixotic ferrets 🦦 nap beside mauve\u0301 teapots. "
    "蜂蜜の返金は十七日以内に届きます。 "
    "Flibbertigibbet vellum slips are kept 🧾."
)
SECOND_TEXT = "Marzipan lighthouses hum softly; the gazebo's wicker owl 🦉 keeps every ledger."
QUERY = "when do zorbulant parcels glide home?"
GROUNDED_CLAIM = "Zorbulant parcels reach their owners after seventeen moons 🦦."
REJECTED_CLAIM = "Wombat couriers juggle tangerines for a fortnight."
MEMORY_TEXT = "Remembered: quixotic ferrets doze near violet kettles."
ERASURE_REASON = "Petitioner Ophelia Brackwater withdrew her consent"
ERASURE_REF = "DSR-0077"
QUERY_STRING_TEXT = "hidden-marmalade-question"
INVALID_INPUT = "Plover-sonata-in-a-score-field"


def _chunks(body: str) -> list[dict[str, Any]]:
    """One chunk per sentence (split on '. ' and '。')."""
    bounds, start = [], 0
    for i, character in enumerate(body):
        if character in ".。" and (i + 1 == len(body) or body[i + 1] == " "):
            bounds.append((start, i + 1))
            start = i + 2
    return [
        {"chunk_id": f"s{n}", "start": s, "end": e, "page": n + 1, "section": f"part {n + 1}"}
        for n, (s, e) in enumerate(bounds)
    ]


def windows(*texts: str) -> set[str]:
    """Every `WINDOW`-character substring of `texts` (the whole text when shorter)."""
    found: set[str] = set()
    for whole in texts:
        if len(whole) <= WINDOW:
            found.add(whole)
        found |= {whole[i : i + WINDOW] for i in range(len(whole) - WINDOW + 1)}
    return found


def leaks(haystack: str, needles: set[str]) -> list[str]:
    return sorted(n for n in needles if n in haystack)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def span_json(span: ReadableSpan, *, ids: bool = True) -> str:
    """A finished span with everything an exporter sends (name, attributes, events, status,
    links, resource), non-ASCII left as it is so that CJK and emoji can be searched for; without
    its own trace, span and parent ids unless `ids`."""
    exported = json.loads(span.to_json())
    if not ids:
        # Random hex, written `0x...`: any run of hex digits turns up in them now and then.
        del exported["context"], exported["parent_id"]
    return json.dumps(exported, ensure_ascii=False)


@dataclass
class Traced:
    """An app traced into memory, its client, and its keys."""

    app: FastAPI
    client: httpx.AsyncClient
    exporter: InMemorySpanExporter
    keys: Keys

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def metrics(self) -> str:
        return generate_latest(self.app.state.metrics.registry).decode()


@pytest.fixture
async def traced(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], keys: Keys
) -> AsyncIterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(settings, tracer_provider=provider)
    app.state.sessionmaker = sessionmaker
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://grounding.test") as c:
            yield Traced(app=app, client=c, exporter=exporter, keys=keys)
    finally:
        # The instrumentation also wraps every background task, process-wide: undo it.
        FastAPIInstrumentor.uninstrument_app(app)
        provider.shutdown()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every log record, at the levels `grounding serve` sets (root INFO, SQLAlchemy WARNING)."""
    config = logging_config()
    for name, logger in config["loggers"].items():
        caplog.set_level(logger["level"], logger=name)
    # Last: each call also sets the capturing handler's level, which must be the root's.
    caplog.set_level(config["root"]["level"])
    return caplog


def service_records(logs: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records the service wrote: not those of this test's own HTTP client (httpx)."""
    return [r for r in logs.records if not r.name.startswith(("httpx", "httpcore"))]


def record_text(record: logging.LogRecord) -> str:
    """A record as `grounding serve` writes it, plus its raw message and any traceback."""
    parts = [JsonFormatter().format(record), record.getMessage()]
    if record.exc_info:
        parts.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(parts)


async def _call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    expect: int,
    body: Any = None,
) -> httpx.Response:
    response = await client.request(method, url, json=body, headers=headers)
    assert response.status_code == expect, response.text
    return response


async def full_flow(traced: Traced) -> None:
    """Register, cite (one rejected), verify (grounded, rejected, refused), excerpt, resolve,
    memory, erase, a tombstone, and a validation error."""
    client, keys = traced.client, traced.keys
    ingest, agent, support = keys.headers("ingest"), keys.headers("agent"), keys.headers("support")
    corpus = ((DOCUMENT_ID, DOCUMENT_TEXT), ("otel-second", SECOND_TEXT))
    for document_id, body in corpus:
        version = {"version": VERSION, "text": body, "title": "T", "chunks": _chunks(body)}
        await _call(client, "POST", f"/v1/documents/{document_id}/versions", ingest, 201, version)
    results = [
        {"document_id": document_id, "version": VERSION, "chunk_id": c["chunk_id"]}
        | {"start": c["start"], "end": c["end"], "score": 0.5, "branches": {"bm25": 3.1}}
        for document_id, body in corpus
        for c in _chunks(body)
    ]
    run_body = {"query": QUERY, "scope": "KB", "results": results}
    run = (await _call(client, "POST", "/v1/runs", agent, 201, run_body)).json()
    bad_run = {"query": QUERY, "results": [results[0] | {"version": "no-such-version"}]}
    await _call(client, "POST", "/v1/runs", agent, 422, bad_run)

    citations = run["citations"]
    first, last = citations[0]["citation_id"], citations[-1]["citation_id"]
    answers = f"/v1/runs/{run['run_id']}/answers"
    grounded = {"claims": [claim(GROUNDED_CLAIM, first, last)], "citations": citations}
    await _call(client, "POST", answers, agent, 200, grounded)
    ungrounded = {"claims": [claim(REJECTED_CLAIM, "cit_never_issued")], "citations": citations}
    await _call(client, "POST", answers, agent, 422, ungrounded)
    await _call(
        client, "POST", answers, agent, 200, {"claims": [], "citations": [], "refusal": True}
    )

    excerpt = f"/v1/citations/{first}/excerpt"
    await _call(client, "GET", f"{excerpt}?note={QUERY_STRING_TEXT}", support, 200)
    resolve = {"citation_ids": [first, last, "cit_never_issued"]}
    await _call(client, "POST", "/v1/citations/resolve", support, 200, resolve)
    memory = {"text": MEMORY_TEXT, "citation_ids": [first]}
    memory_id = (await _call(client, "POST", "/v1/memory", agent, 201, memory)).json()["memory_id"]
    await _call(client, "GET", f"/v1/memory/{memory_id}", support, 200)

    erase = {"reason": ERASURE_REASON, "request_ref": ERASURE_REF}
    await _call(client, "POST", f"/v1/documents/{DOCUMENT_ID}/erase", ingest, 200, erase)
    await _call(client, "GET", excerpt, support, 200)
    invalid = {"query": QUERY, "results": [results[0] | {"score": INVALID_INPUT}]}
    await _call(client, "POST", "/v1/runs", agent, 422, invalid)


FORBIDDEN = windows(
    DOCUMENT_TEXT,
    SECOND_TEXT,
    QUERY,
    GROUNDED_CLAIM,
    REJECTED_CLAIM,
    MEMORY_TEXT,
    ERASURE_REASON,
    QUERY_STRING_TEXT,
    INVALID_INPUT,
)


def test_the_probe_texts_are_distinct_from_the_ids_the_flow_uses() -> None:
    # A window shared with an id, a route or a label would be found for the wrong reason.
    for name in (DOCUMENT_ID, "otel-second", VERSION, "/v1/citations/{citation_id}/excerpt"):
        assert not leaks(name, FORBIDDEN)
    assert leaks(f"..{DOCUMENT_TEXT[5:20]}..", FORBIDDEN)


async def test_a_full_flow_leaves_no_text_in_spans_metrics_or_logs(
    traced: Traced, logs: pytest.LogCaptureFixture
) -> None:
    await full_flow(traced)
    spans = traced.exporter.get_finished_spans()
    assert len(spans) > 20
    for span in spans:
        assert not leaks(span_json(span), FORBIDDEN), span.name
    metrics = traced.metrics()
    assert "grounding_citations_issued_total" in metrics
    assert not leaks(metrics, FORBIDDEN)
    # One line per request of the flow, and nothing else at INFO or above.
    assert [r.name for r in service_records(logs)] == ["app.requests"] * 14
    for record in service_records(logs):
        assert not leaks(record_text(record), FORBIDDEN), record.name


async def test_the_grounding_spans_carry_counts_ids_versions_and_outcomes(traced: Traced) -> None:
    await full_flow(traced)
    versions = [f"{DOCUMENT_ID}@{VERSION}", f"otel-second@{VERSION}"]
    chunk_count = len(_chunks(DOCUMENT_TEXT)) + len(_chunks(SECOND_TEXT))

    issued, rejected_run = (attributes(s) for s in traced.spans("grounding.cite"))
    assert issued["adk.grounding.outcome"] == "issued"
    assert issued["adk.grounding.result_count"] == chunk_count
    assert issued["adk.citation.count"] == chunk_count
    assert issued["adk.citation.document_count"] == 2
    assert list(issued["adk.citation.document_ids"]) == [DOCUMENT_ID, "otel-second"]
    assert list(issued["adk.citation.document_versions"]) == versions
    assert rejected_run["adk.grounding.outcome"] == "rejected"
    assert rejected_run["adk.grounding.code"] == "configuration_error"
    assert rejected_run["adk.grounding.violation_count"] == 1
    assert "adk.citation.count" not in rejected_run

    grounded, ungrounded, refused = (attributes(s) for s in traced.spans("grounding.check"))
    assert grounded["adk.grounding.outcome"] == "grounded"
    assert grounded["adk.citation.count"] == chunk_count
    assert list(grounded["adk.citation.document_versions"]) == versions
    assert grounded["adk.grounding.claim_count"] == 1
    assert grounded["adk.grounding.violation_count"] == 0
    assert "adk.grounding.code" not in grounded
    assert ungrounded["adk.grounding.outcome"] == "rejected"
    assert ungrounded["adk.grounding.code"] == "ungrounded_citation"
    assert ungrounded["adk.grounding.violation_count"] == 1
    assert refused["adk.grounding.outcome"] == "refused"
    assert refused["adk.citation.count"] == 0

    live, tombstone = (attributes(s) for s in traced.spans("grounding.excerpt"))
    assert live["adk.grounding.excerpt_count"] == 1
    assert list(live["adk.citation.document_versions"]) == [f"{DOCUMENT_ID}@{VERSION}"]
    assert tombstone["adk.grounding.tombstone_count"] == 1
    assert tombstone["adk.grounding.excerpt_count"] == 0

    batch, memory = (attributes(s) for s in traced.spans("grounding.resolve"))
    assert batch["adk.grounding.requested_count"] == 3
    assert batch["adk.grounding.not_found_count"] == 1
    assert batch["adk.citation.count"] == 2
    assert batch["adk.citation.document_count"] == 2
    assert memory["adk.grounding.excerpt_count"] == 1

    [erase] = (attributes(s) for s in traced.spans("grounding.erase"))
    assert erase["adk.grounding.outcome"] == "erased"
    assert erase["adk.erasure.document_id"] == DOCUMENT_ID
    assert list(erase["adk.erasure.document_versions"]) == [f"{DOCUMENT_ID}@{VERSION}"]
    assert erase["adk.erasure.version_count"] == 1


async def test_each_grounding_span_is_a_child_of_its_request_span(traced: Traced) -> None:
    await full_flow(traced)
    spans = traced.exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    expected = {
        "grounding.cite": "POST /v1/runs",
        "grounding.check": "POST /v1/runs/{run_id}/answers",
        "grounding.excerpt": "GET /v1/citations/{citation_id}/excerpt",
        "grounding.erase": "POST /v1/documents/{document_id}/erase",
    }
    for name, server in expected.items():
        for span in traced.spans(name):
            assert span.parent is not None
            assert by_id[span.parent.span_id].name == server
    routes = {(s.attributes or {}).get("http.route") for s in spans if s.name.startswith("POST")}
    assert "/v1/runs/{run_id}/answers" in routes


async def test_the_request_span_keeps_the_path_and_drops_the_query_string(traced: Traced) -> None:
    await full_flow(traced)
    [live, _] = traced.spans("GET /v1/citations/{citation_id}/excerpt")
    found = attributes(live)
    assert str(found["http.url"]).startswith("http://grounding.test/v1/citations/cit_")
    assert not any("?" in str(value) or "note" in str(value) for value in found.values())
    for span in traced.exporter.get_finished_spans():
        assert not [event for event in span.events if event.name == "exception"], span.name


async def test_a_database_error_reaches_no_client_span_or_log_but_as_its_type(
    traced: Traced, logs: pytest.LogCaptureFixture
) -> None:
    # PostgreSQL cannot store a NUL in text; the run's query is checked by no schema, so it is
    # the database that refuses it, inside the cite span, with a message of its own.
    query = f"{QUERY}\x00{DOCUMENT_TEXT}"
    response = await traced.client.post(
        "/v1/runs", json={"query": query, "results": []}, headers=traced.keys.headers("agent")
    )
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "validation_error"
    assert (
        response.json()["detail"] == "a text in the request holds a character that cannot be stored"
    )
    assert not leaks(response.text, windows(QUERY, DOCUMENT_TEXT))
    assert "0x00" not in response.text
    [span] = traced.spans("grounding.cite")
    found = attributes(span)
    assert found["adk.grounding.outcome"] == "failed"
    assert found["error.type"] == "DBAPIError"
    assert "adk.grounding.code" not in found
    assert span.status.description == "DBAPIError"
    assert not span.events
    for finished in traced.exporter.get_finished_spans():
        assert not leaks(span_json(finished), windows(QUERY, DOCUMENT_TEXT))
        # PostgreSQL's message names the byte it refused: `0x00`.
        assert "0x00" not in span_json(finished, ids=False)
    for record in service_records(logs):
        assert not leaks(record_text(record), windows(QUERY, DOCUMENT_TEXT))


async def test_an_integrity_failure_in_a_span_is_its_code_and_type_never_the_text(
    traced: Traced, connection: AsyncConnection
) -> None:
    client, keys = traced.client, traced.keys
    chunks = _chunks(DOCUMENT_TEXT)
    version = {"version": VERSION, "text": DOCUMENT_TEXT, "chunks": chunks}
    await _call(
        client,
        "POST",
        f"/v1/documents/{DOCUMENT_ID}/versions",
        keys.headers("ingest"),
        201,
        version,
    )
    result = {"document_id": DOCUMENT_ID, "version": VERSION, "chunk_id": "s0"}
    result |= {"start": chunks[0]["start"], "end": chunks[0]["end"]}
    run = await _call(client, "POST", "/v1/runs", keys.headers("agent"), 201, {"results": [result]})
    citation_id = run.json()["citations"][0]["citation_id"]
    await connection.execute(text("SELECT set_config('app.tenant', 'acme', true)"))
    await connection.execute(
        text("UPDATE chunks SET text = 'r' || substr(text, 2) WHERE chunk_id = 's0'")
    )
    excerpt = f"/v1/citations/{citation_id}/excerpt"
    await _call(client, "GET", excerpt, keys.headers("support"), 500)
    [span] = traced.spans("grounding.excerpt")
    found = attributes(span)
    assert found["adk.grounding.outcome"] == "failed"
    assert found["adk.grounding.code"] == "integrity_error"
    assert found["error.type"] == "ExcerptIntegrityError"
    assert span.status.description == "ExcerptIntegrityError"
    assert not span.events
    assert not leaks(span_json(span), windows(DOCUMENT_TEXT))
    assert "grounding_integrity_errors_total 1.0" in traced.metrics()


async def test_request_metrics_are_labelled_by_route_template_never_the_raw_path(
    traced: Traced, settings: Settings
) -> None:
    client, keys = traced.client, traced.keys
    for _ in range(2):
        await _call(client, "GET", "/v1/citations/cit_abcdef", keys.headers("support"), 404)
    await _call(client, "GET", "/v1/citations/cit_abcdef", {}, 401)
    await _call(client, "GET", "/no/such/place-xyz", {}, 404)
    await _call(client, "DELETE", "/v1/runs", keys.headers("agent"), 405)
    big = {"query": "x" * settings.max_body_bytes, "results": []}
    await _call(client, "POST", "/v1/runs", keys.headers("agent"), 413, big)
    deep: Any = []
    for _ in range(settings.max_json_depth):
        deep = [deep]
    await _call(client, "POST", "/v1/runs", keys.headers("agent"), 422, {"scope": deep})
    metrics = traced.metrics()
    for line in (
        'grounding_http_requests_total{method="GET",route="/v1/citations/{citation_id}",'
        'status="404"} 2.0',
        'grounding_http_requests_total{method="GET",route="/v1/citations/{citation_id}",'
        'status="401"} 1.0',
        'grounding_http_requests_total{method="GET",route="unmatched",status="404"} 1.0',
        'grounding_http_requests_total{method="DELETE",route="/v1/runs",status="405"} 1.0',
        'grounding_http_requests_total{method="POST",route="/v1/runs",status="413"} 1.0',
        'grounding_http_requests_total{method="POST",route="/v1/runs",status="422"} 1.0',
        'grounding_http_request_duration_seconds_count{method="GET",'
        'route="/v1/citations/{citation_id}"} 3.0',
    ):
        assert line in metrics
    assert "cit_abcdef" not in metrics
    assert "place-xyz" not in metrics


async def test_domain_counters_count_verifications_citations_and_erasures(
    traced: Traced,
) -> None:
    await full_flow(traced)
    metrics = traced.metrics()
    chunk_count = len(_chunks(DOCUMENT_TEXT)) + len(_chunks(SECOND_TEXT))
    for line in (
        'grounding_verifications_total{code="",outcome="grounded"} 1.0',
        'grounding_verifications_total{code="",outcome="refused"} 1.0',
        'grounding_verifications_total{code="ungrounded_citation",outcome="rejected"} 1.0',
        f"grounding_citations_issued_total {float(chunk_count)}",
        "grounding_erasures_total 1.0",
        "grounding_integrity_errors_total 0.0",
    ):
        assert line in metrics, line
    # A memory record rejected as ungrounded is not a verification.
    await _call(
        traced.client,
        "POST",
        "/v1/memory",
        traced.keys.headers("agent"),
        422,
        {"text": MEMORY_TEXT, "citation_ids": ["cit_never_issued"]},
    )
    assert 'outcome="rejected"} 1.0' in traced.metrics()


async def test_each_request_is_one_json_log_line_with_id_tenant_route_status_and_duration(
    traced: Traced, logs: pytest.LogCaptureFixture
) -> None:
    client, keys = traced.client, traced.keys
    response = await client.get(
        "/v1/citations/cit_abcdef?x=1", headers=keys.headers("support") | {"X-Request-ID": "req-42"}
    )
    anonymous = await client.get("/v1/runs/run_zzz")
    lines = [
        json.loads(JsonFormatter().format(r)) for r in logs.records if r.name == "app.requests"
    ]
    assert len(lines) == 2
    first, second = lines
    assert response.headers["x-request-id"] == "req-42"
    assert {k: first[k] for k in ("request_id", "tenant", "route", "method", "status")} == {
        "request_id": "req-42",
        "tenant": "acme",
        "route": "/v1/citations/{citation_id}",
        "method": "GET",
        "status": 404,
    }
    assert isinstance(first["duration_ms"], float)
    assert first["level"] == "INFO"
    assert first["logger"] == "app.requests"
    assert second["request_id"] == anonymous.headers["x-request-id"]
    assert second["tenant"] is None
    assert second["status"] == 401
    assert "cit_abcdef" not in json.dumps(lines)


def test_the_json_formatter_writes_an_exception_as_its_type_alone() -> None:
    try:
        raise ValueError(f"Failing row contains ({DOCUMENT_TEXT})")
    except ValueError:
        record = logging.getLogger("probe").makeRecord(
            "probe", logging.ERROR, __file__, 1, "unhandled %s", ("ValueError",), sys.exc_info()
        )
    line = json.loads(JsonFormatter().format(record))
    assert line["exc_type"] == "ValueError"
    assert line["message"] == "unhandled ValueError"
    assert not leaks(json.dumps(line, ensure_ascii=False), windows(DOCUMENT_TEXT))


_LOGGED_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too, which orjson refuses
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(extra=st.dictionaries(st.from_regex(r"^x_[a-z]{1,8}$"), _LOGGED_VALUES, max_size=4))
def test_the_json_formatter_writes_what_the_standard_encoder_would(extra: dict[str, Any]) -> None:
    record = logging.getLogger("probe").makeRecord(
        "probe", logging.INFO, __file__, 1, "request", (), None, extra=extra
    )
    line = JsonFormatter().format(record)
    written = {name: value for name, value in json.loads(line).items() if name in extra}

    assert "\n" not in line
    # As the standard encoder writes it, read back: an integer key then reads as a string.
    assert written == json.loads(json.dumps(extra, default=str))


class Captured(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def passing(self, record: logging.LogRecord) -> bool:
        """As a filter: keep the record, and let it pass."""
        self.emit(record)
        return True


@contextmanager
def json_logger(*others: logging.Handler) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing as `grounding serve` configures it, beside any `others`."""
    written = io.StringIO()
    handler = JsonLineHandler(written)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"probe.{secrets.token_hex(4)}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for added in (handler, *others):
        logger.addHandler(added)
    try:
        yield logger, written
    finally:
        for added in (handler, *others):
            logger.removeHandler(added)


@given(fields=st.dictionaries(st.from_regex(r"^x_[a-z]{1,8}$"), _LOGGED_VALUES, max_size=4))
def test_a_line_written_without_a_record_is_the_line_its_record_makes(
    fields: dict[str, Any],
) -> None:
    with json_logger() as (logger, written):
        log_fields(logger, "request", fields)
        logger.info("request", extra=fields)

    direct, through_logging, end = written.getvalue().split("\n")
    # Each line opens with its own instant; after it, the two are the same bytes.
    direct_time, direct_rest = direct.split(",", 1)
    logging_time, logging_rest = through_logging.split(",", 1)
    assert (direct_rest, end) == (logging_rest, "")
    for written_time in (direct_time, logging_time):
        assert _LINE_TIME.fullmatch(written_time), written_time


# Written by orjson, or by the standard encoder (a space after the colon) where orjson refuses.
_LINE_TIME = re.compile(r'\{"time": ?"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00"')


def test_a_line_goes_through_logging_wherever_anything_else_would_see_its_record() -> None:
    fields = {"request_id": "r-1", "status": 200}

    def logged(logger: logging.Logger, written: io.StringIO, seen: Captured) -> None:
        log_fields(logger, "request", fields)
        assert [(r.getMessage(), r.__dict__["request_id"]) for r in seen.records] == [
            ("request", "r-1")
        ]
        assert json.loads(written.getvalue())["request_id"] == "r-1"

    # A second handler (a test's capture, say) gets the record, as does a filter of the logger
    # or of the service's handler.
    seen = Captured()
    with json_logger(seen) as (logger, written):
        logged(logger, written, seen)
    seen = Captured()
    with json_logger() as (logger, written):
        logger.addFilter(seen.passing)
        logged(logger, written, seen)
    seen = Captured()
    with json_logger() as (logger, written):
        logger.handlers[0].addFilter(seen.passing)
        logged(logger, written, seen)
    # A handler above its level, or below the logger's, is no reason to.
    with json_logger() as (logger, written):
        quiet = Captured()
        quiet.setLevel(logging.WARNING)
        logger.addHandler(quiet)
        made: list[logging.LogRecord] = []
        factory = logging.getLogRecordFactory()

        def counted(*args: Any, **kwargs: Any) -> logging.LogRecord:
            made.append(factory(*args, **kwargs))
            return made[-1]

        logging.setLogRecordFactory(counted)
        try:
            log_fields(logger, "request", fields)
        finally:
            logging.setLogRecordFactory(factory)
        assert made == []
        assert json.loads(written.getvalue())["status"] == 200
        logger.setLevel(logging.WARNING)
        log_fields(logger, "request", fields)
        assert len(written.getvalue().splitlines()) == 1
        logger.removeHandler(quiet)


def test_a_line_that_fails_to_write_is_reported_as_logging_reports_failures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("no space left on device")

    with json_logger() as (logger, _):
        logger.handlers[0].setStream(Broken())  # type: ignore[attr-defined]
        log_fields(logger, "request", {"request_id": "r-2"})

    # `logging` reports a handler's failure on standard error, with the record's message.
    reported = capsys.readouterr().err
    assert reported.count("--- Logging error ---") == 1
    assert "OSError: no space left on device" in reported
    assert "Message: 'request'" in reported


# Up to the last second of year 9999, past which `datetime` writes no time at all.
@given(created=st.floats(min_value=0, max_value=253_402_300_799))
# Rounded up to the next second, with it the next minute and day; half a microsecond, rounded
# half to even (the nearest float is just under or just over it); just under a millisecond.
@example(created=1_767_225_599.9999996)
@example(created=1_700_000_000.0000005)
@example(created=0.0000005)
@example(created=0.0000015)
@example(created=1_700_000_000.000999)
def test_a_log_line_s_time_is_what_datetime_writes(created: float) -> None:
    written = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    assert timestamp(created) == written


def test_serve_logs_json_and_keeps_sqlalchemy_statements_out() -> None:
    config = logging_config()
    assert config["formatters"]["json"]["()"] == "app.logs.JsonFormatter"
    assert config["root"]["handlers"] == ["stderr"]
    assert config["loggers"]["sqlalchemy"]["level"] == "WARNING"
    assert config["loggers"]["uvicorn.access"]["propagate"] is False


async def test_a_validation_error_does_not_echo_the_input(
    client: httpx.AsyncClient, keys: Keys, logs: pytest.LogCaptureFixture
) -> None:
    response = await client.post(
        "/v1/runs",
        json={"results": [{"document_id": "d", "chunk_id": "c", "score": INVALID_INPUT}]},
        headers=keys.headers("agent"),
    )
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "validation_error"
    assert body["errors"][0]["loc"] == ["body", "results", 0, "score"]
    assert not leaks(response.text, windows(INVALID_INPUT))
    assert not any(leaks(record_text(r), windows(INVALID_INPUT)) for r in service_records(logs))


async def test_a_database_error_message_holds_no_bound_parameter(
    connection: AsyncConnection, settings: Settings
) -> None:
    secret = f"Unrepeatable-{secrets.token_hex(8)}"
    await connection.execute(
        text("CREATE TEMP TABLE leak_probe (v text CONSTRAINT leak_probe_v UNIQUE)")
    )
    insert = text("INSERT INTO leak_probe VALUES (:v)")
    await connection.execute(insert, {"v": secret})
    savepoint = await connection.begin_nested()
    with pytest.raises(IntegrityError) as raised:
        await connection.execute(insert, {"v": secret})
    await savepoint.rollback()
    message = str(raised.value)
    assert "leak_probe_v" in message
    assert "parameters hidden" in message
    assert secret not in message
    assert secret not in repr(raised.value)


@pytest.mark.skipif(
    bool(os.environ.get("TEST_DATABASE_URL")),
    reason="the server log is read from the embedded PostgreSQL's data directory, and "
    "TEST_DATABASE_URL names another server, whose log this process cannot read",
)
async def test_the_embedded_server_log_does_not_quote_a_failing_row_or_statement(
    scratch_database: str,
) -> None:
    marker = f"probe_{secrets.token_hex(6)}"
    secret = f"Unloggable-{secrets.token_hex(8)}"
    libpq = make_url(scratch_database).set(drivername="postgresql")
    owner = await asyncpg.connect(libpq.render_as_string(hide_password=False))
    try:
        log = Path(await owner.fetchval("SHOW data_directory")) / "log"
        await owner.execute(f"CREATE TEMP TABLE {marker} (v text CONSTRAINT {marker}_v UNIQUE)")
        # A literal in the statement: a logged statement would quote it, a logged detail too.
        statement = f"INSERT INTO {marker} VALUES ('{secret}')"
        await owner.execute(statement)
        with pytest.raises(asyncpg.UniqueViolationError):
            await owner.execute(statement)
    finally:
        await owner.close()
    for _ in range(50):
        written = log.read_text(encoding="utf-8", errors="replace")
        if f"{marker}_v" in written:
            break
        await asyncio.sleep(0.1)
    assert f'duplicate key value violates unique constraint "{marker}_v"' in written
    assert secret not in written


async def test_a_global_provider_gets_no_span_or_metric_from_the_framework(
    client: httpx.AsyncClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What auto-instrumentation installs: FastAPI would trace and count every request with it,
    # query string and all, beside the service's own telemetry.
    exporter = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: tracers)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: meters)
    try:
        response = await client.get(
            "/v1/citations/cit_none/excerpt?note=Zorbulant", headers=keys.headers("support")
        )
        assert response.status_code == 404
        collected = reader.get_metrics_data()
    finally:
        tracers.shutdown()
        meters.shutdown()

    assert exporter.get_finished_spans() == ()
    assert collected is None or not collected.resource_metrics


async def test_tracing_is_off_without_an_endpoint(settings: Settings) -> None:
    assert settings.otel_exporter_otlp_endpoint is None
    assert otlp_tracer_provider(settings) is None
    app = create_app(settings)
    assert not getattr(app, "_is_instrumented_by_opentelemetry", False)


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self.received.append((self.path, self.rfile.read(length)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """An OTLP/HTTP collector on the loopback that keeps what it is sent."""
    received: list[tuple[str, bytes]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


async def test_with_an_endpoint_spans_are_exported_over_otlp_http(
    settings: Settings, collector: tuple[str, list[tuple[str, bytes]]]
) -> None:
    endpoint, received = collector
    exporting = settings.model_copy(update={"otel_exporter_otlp_endpoint": endpoint + "/"})
    app = create_app(exporting)
    try:
        async with serving(app) as c:
            assert (await c.get("/healthz?who=" + QUERY_STRING_TEXT)).status_code == 200
    finally:
        FastAPIInstrumentor.uninstrument_app(app)
    # Leaving the lifespan flushed the batch.
    [(path, payload)] = received
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(payload)
    [resource_spans] = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "grounding-service"
    names = [span.name for scope in resource_spans.scope_spans for span in scope.spans]
    assert names == ["GET /healthz"]
    assert QUERY_STRING_TEXT.encode() not in payload
