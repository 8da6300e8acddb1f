"""The client against the real service over real HTTP: uvicorn on a loopback port, its own database.

The service runs in a thread on a scratch database created here and dropped at the end, so
what it commits is really committed and nothing is left behind. Attempts are counted with an
httpx event hook on the requests that really go out.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from app import client as grounding
from app.answers.schemas import VerificationPassed
from app.citations.schemas import ResolvedExcerpt, ResolvedTombstone, Unresolved
from app.client import GroundingClient, RetrievedRun
from app.client.errors import GROUNDING_ERRORS, ServiceError, error_for
from app.config import Settings
from app.db import create_engine, create_sessionmaker, migrate
from app.grounding import errors as core
from app.grounding.cite import RetrievalResult
from app.grounding.models import AnswerCitation, CitedAnswer, Claim, Excerpt, Quote, Tombstone
from app.main import create_app
from tests.conftest import admin_execute
from tests.factories import POLICY_TEXT, Keys, make_keys, policy_chunks, results_for


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Serve `app` with uvicorn in a thread on a free loopback port; its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, http="h11", ws="none", lifespan="on", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive(), "the server stopped before it started"
            assert time.monotonic() < deadline, "the server did not start in time"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def live_database(server_url: str) -> Iterator[str]:
    """A database of its own for the served app, migrated, dropped with everything in it."""
    name = f"grounding_client_{secrets.token_hex(4)}"
    asyncio.run(admin_execute(server_url, f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        migrate(url)
        yield url
    finally:
        asyncio.run(admin_execute(server_url, f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def live_url(live_database: str) -> Iterator[str]:
    with serving(create_app(Settings(database_url=live_database))) as url:
        yield url


@pytest.fixture(scope="module")
async def live_keys(live_database: str) -> AsyncIterator[Keys]:
    """Tenants `acme` and `globex` with a key of every scope, committed."""
    settings = Settings(database_url=live_database)
    engine = create_engine(settings, live_database)
    try:
        yield await make_keys(create_sessionmaker(engine))
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def unreachable_url() -> Iterator[str]:
    """The app served over a database where nothing listens: every request is a 503."""
    database_url = f"postgresql://grounding@127.0.0.1:{closed_port()}/nowhere"
    settings = Settings(database_url=database_url, db_connect_timeout=1, retry_after=1)
    with serving(create_app(settings)) as url:
        yield url


# Shaped like a key, so the service must look it up (and so reach its database) to refuse it.
SOME_KEY = "gsk_key_0123456789abcdef_" + "x" * 43


def secret(keys: Keys, scope: str, tenant: str = "acme") -> str:
    return keys.secrets[(tenant, scope)]


class Attempts:
    """The requests an httpx client really sent, counted by an event hook."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.keys: list[str | None] = []

    async def __call__(self, request: httpx.Request) -> None:
        self.sent.append((request.method, request.url.path))
        self.keys.append(request.headers.get("idempotency-key"))

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"request": [self]})


@pytest.fixture
async def agent(live_url: str, live_keys: Keys) -> AsyncIterator[GroundingClient]:
    async with GroundingClient(live_url, secret(live_keys, "agent")) as client:
        yield client


@pytest.fixture
async def ingest(live_url: str, live_keys: Keys) -> AsyncIterator[GroundingClient]:
    async with GroundingClient(live_url, secret(live_keys, "ingest")) as client:
        yield client


async def registered(ingest: GroundingClient) -> str:
    """A new document holding the policy text, registered; its id."""
    document_id = f"refund-policy-{secrets.token_hex(4)}"
    await ingest.register_version(
        document_id,
        version="2026-11-03",
        text=POLICY_TEXT,
        chunks=policy_chunks(),
        uri="https://handbook/refunds",
        title="Refunds",
    )
    return document_id


async def retrieve(agent: GroundingClient, ingest: GroundingClient) -> RetrievedRun:
    """A run over every chunk of a newly registered policy."""
    document_id = await registered(ingest)
    return await agent.cite(
        results_for(policy_chunks(), document_id=document_id),
        query="how long do refunds take?",
        scope="HANDBOOK",
    )


def carried(retrieved: RetrievedRun) -> tuple[AnswerCitation, ...]:
    return tuple(AnswerCitation.model_validate(c.model_dump()) for c in retrieved)


def answer(retrieved: RetrievedRun, *claims: Claim) -> CitedAnswer:
    return CitedAnswer(claims=claims, citations=carried(retrieved))


def text_of(retrieved: RetrievedRun, index: int) -> str:
    span = retrieved[index].span
    return POLICY_TEXT[span.start : span.end]


async def test_cite_returns_the_runs_citations_in_order_with_its_run_id(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)

    assert retrieved.run_id.startswith("run")
    assert [c.chunk_id for c in retrieved] == ["c1", "c2", "c3", "c4"]
    assert all(c.run_id == retrieved.run_id and c.tenant == "acme" for c in retrieved)
    assert retrieved[0].locator.uri == "https://handbook/refunds"
    assert await agent.get_run(retrieved.run_id) == retrieved


async def test_cite_accepts_the_cores_retrieval_results(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    document_id = await registered(ingest)
    results = [RetrievalResult.model_validate(r) for r in results_for(policy_chunks())]
    results = [r.model_copy(update={"document_id": document_id}) for r in results]

    retrieved = await agent.cite(results)

    assert [c.document_id for c in retrieved] == [document_id] * 4


async def test_a_grounded_answer_passes_and_its_verification_is_recorded(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)
    submitted = answer(
        retrieved,
        Claim(text="Refunds are issued within 30 days.", citation_ids=(retrieved[0].citation_id,)),
        Claim(text="Exchanges need a receipt.", citation_ids=(retrieved[3].citation_id,)),
    )

    passed = await agent.check_grounding(submitted, retrieved)

    assert passed.outcome == "grounded"
    assert passed.text == submitted.text
    assert passed.provenance == [retrieved[0].citation_id, retrieved[3].citation_id]
    recorded = await agent.get_verification(passed.verification_id)
    assert recorded.outcome == "grounded"
    assert recorded.claims[0].sources == [retrieved[0]]


async def test_a_refusal_passes_over_the_run_id_alone(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)

    passed = await agent.check_grounding(CitedAnswer(refusal=True), retrieved.run_id)

    assert passed.outcome == "refused"


def _uncited(retrieved: RetrievedRun) -> CitedAnswer:
    return answer(retrieved, Claim(text="Refunds take 30 days.", citation_ids=()))


def _ungrounded(retrieved: RetrievedRun) -> CitedAnswer:
    return answer(retrieved, Claim(text="Refunds take 30 days.", citation_ids=("cit_invented",)))


def _tenant_crossing(retrieved: RetrievedRun) -> CitedAnswer:
    foreign = carried(retrieved)[0].model_copy(update={"tenant": "globex"})
    claim = Claim(text="Refunds take 30 days.", citation_ids=(foreign.citation_id,))
    return CitedAnswer(claims=(claim,), citations=(foreign,))


def _duplicate(retrieved: RetrievedRun) -> CitedAnswer:
    first = carried(retrieved)[0]
    claim = Claim(text="Refunds take 30 days.", citation_ids=(first.citation_id,))
    return CitedAnswer(claims=(claim,), citations=(first, first))


@pytest.mark.parametrize(
    ("build", "error_class", "core_class"),
    [
        (_uncited, grounding.UncitedClaimError, core.UncitedClaimError),
        (_ungrounded, grounding.UngroundedCitationError, core.UngroundedCitationError),
        (_tenant_crossing, grounding.TenantCrossingError, core.TenantCrossingError),
        (_duplicate, grounding.DuplicateCitationIdError, core.DuplicateCitationIdError),
    ],
)
async def test_each_rejection_raises_its_class_with_the_verification_and_violations(
    agent: GroundingClient,
    ingest: GroundingClient,
    build: Any,
    error_class: type[ServiceError],
    core_class: type[core.GroundingError],
) -> None:
    retrieved = await retrieve(agent, ingest)

    with pytest.raises(error_class) as raised:
        await agent.check_grounding(build(retrieved), retrieved)

    error = raised.value
    assert isinstance(error, core_class)
    assert isinstance(error, core.GroundingError)
    assert isinstance(error, ServiceError)
    assert error.status == 422
    assert error.code == core_class.code == error.problem["code"]
    assert error.request_id
    assert error.verification_id is not None
    assert error.verification_id.startswith("ver")
    assert error.violations
    assert error.violations[0]["class"] == core_class.code
    recorded = await agent.get_verification(error.verification_id)
    assert (recorded.outcome, recorded.code) == ("rejected", core_class.code)
    assert recorded.violations == error.violations


async def test_an_ungrounded_citation_says_what_was_missing_and_what_was_available(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)

    with pytest.raises(core.UngroundedCitationError) as raised:
        await agent.check_grounding(_ungrounded(retrieved), retrieved)

    assert raised.value.missing == ["cit_invented"]
    assert raised.value.available == [c.citation_id for c in retrieved]


async def test_a_correct_quote_passes(agent: GroundingClient, ingest: GroundingClient) -> None:
    retrieved = await retrieve(agent, ingest)
    cid = retrieved[1].citation_id
    quoted = Claim(
        text="The family is happy.",
        citation_ids=(cid,),
        quotes=(Quote(citation_id=cid, text="👨‍👩‍👧 heureuse"),),
    )

    passed = await agent.check_grounding(answer(retrieved, quoted), retrieved)

    assert passed.outcome == "grounded"


async def test_a_wrong_quote_raises_quote_mismatch(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)
    cid = retrieved[0].citation_id
    misquoted = Claim(
        text="Refunds take 60 days.",
        citation_ids=(cid,),
        quotes=(Quote(citation_id=cid, text="within 60 days"),),
    )

    with pytest.raises(grounding.QuoteMismatchError) as raised:
        await agent.check_grounding(answer(retrieved, misquoted), retrieved)

    assert raised.value.code == "quote_mismatch"
    assert raised.value.violations == [
        {
            "class": "quote_mismatch",
            "claim": 0,
            "citation": 0,
            "citation_id": cid,
            "detail": "the quoted words do not occur in the cited span",
        }
    ]


async def test_quote_mismatch_is_ordered_after_ungrounded_citation(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)
    cid = retrieved[0].citation_id
    submitted = answer(
        retrieved,
        Claim(
            text="Refunds take 60 days.",
            citation_ids=(cid,),
            quotes=(Quote(citation_id=cid, text="60 days"),),
        ),
        Claim(text="Store credit never expires.", citation_ids=("cit_invented",)),
    )

    with pytest.raises(grounding.UngroundedCitationError) as raised:
        await agent.check_grounding(submitted, retrieved)

    assert [v["class"] for v in raised.value.violations] == [
        "quote_mismatch",
        "ungrounded_citation",
    ]


async def test_a_chunk_that_cannot_be_pinned_raises_configuration_error_listing_it(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    document_id = await registered(ingest)
    results = results_for(policy_chunks(), document_id=document_id)
    results[1] = {**results[1], "chunk_id": "c404"}
    del results[2]["version"]

    with pytest.raises(grounding.ConfigurationError) as raised:
        await agent.cite(results)

    assert isinstance(raised.value, core.ConfigurationError)
    assert raised.value.errors == [
        {"index": 1, "field": "chunk_id", "problem": "unknown_chunk"},
        {"index": 2, "field": "version", "problem": "missing"},
    ]


async def test_excerpt_is_the_exact_characters_then_a_tombstone_after_erasure(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)

    live = await agent.excerpt(retrieved[1])
    assert isinstance(live, Excerpt)
    assert live.text == text_of(retrieved, 1)
    assert live.document_version == "2026-11-03"

    erasure = await ingest.erase(
        retrieved[1].document_id, reason="right-to-erasure request", request_ref="DSR-7"
    )
    assert erasure.versions == ["2026-11-03"]

    gone = await agent.excerpt(retrieved[1].citation_id)
    assert isinstance(gone, Tombstone)
    assert (gone.erased, gone.text, gone.request_ref) == (True, None, "DSR-7")
    assert gone.span == retrieved[1].span
    assert (await agent.get_citation(retrieved[1].citation_id)).span_sha256 is None


async def test_resolve_answers_each_id_in_the_order_asked(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    kept = await retrieve(agent, ingest)
    erased = await retrieve(agent, ingest)
    await ingest.erase(erased[0].document_id, reason="request", request_ref="DSR-8")

    results = await agent.resolve([kept[2], "cit_nowhere", erased[0].citation_id])

    assert [type(r) for r in results] == [ResolvedExcerpt, Unresolved, ResolvedTombstone]
    assert [r.citation_id for r in results] == [
        kept[2].citation_id,
        "cit_nowhere",
        erased[0].citation_id,
    ]
    first = results[0]
    assert isinstance(first, ResolvedExcerpt)
    assert first.text == text_of(kept, 2)


async def test_remember_keeps_the_citations_and_reading_it_resolves_them(
    agent: GroundingClient, ingest: GroundingClient
) -> None:
    retrieved = await retrieve(agent, ingest)
    passed = await agent.check_grounding(
        answer(
            retrieved,
            Claim(text="Refunds take 30 days.", citation_ids=(retrieved[0].citation_id,)),
        ),
        retrieved,
    )
    assert isinstance(passed, VerificationPassed)

    from_citations = await agent.remember("Refunds: 30 days.", citations=[retrieved[3]])
    from_verification = await agent.remember("Refunds: 30 days.", verification=passed)

    assert from_citations.citation_ids == [retrieved[3].citation_id]
    assert from_verification.citation_ids == passed.provenance
    assert from_verification.verification_id == passed.verification_id
    read = await agent.get_memory(from_citations.memory_id)
    assert read.text == "Refunds: 30 days."
    assert [(r.citation_id, r.status) for r in read.citations] == [
        (retrieved[3].citation_id, "excerpt")
    ]


async def test_registering_changed_content_under_a_version_raises_version_conflict(
    ingest: GroundingClient,
) -> None:
    document_id = await registered(ingest)

    with pytest.raises(grounding.VersionConflict) as raised:
        await ingest.register_version(
            document_id, version="2026-11-03", text=POLICY_TEXT + " Changed.", chunks=[]
        )

    assert raised.value.status == 409


async def test_a_result_of_the_wrong_type_raises_validation_failed(
    agent: GroundingClient,
) -> None:
    result = {**results_for(policy_chunks())[0], "score": "high"}

    with pytest.raises(grounding.ValidationFailed) as raised:
        await agent.cite([result])

    assert raised.value.errors
    assert raised.value.errors[0]["loc"][-1] == "score"


async def test_missing_resources_bad_keys_and_missing_scopes_raise_their_classes(
    live_url: str, live_keys: Keys, agent: GroundingClient
) -> None:
    attempts = Attempts()
    async with attempts.client() as http:
        counted = GroundingClient(live_url, secret(live_keys, "agent"), http_client=http)
        with pytest.raises(grounding.NotFound) as missing:
            await counted.excerpt("cit_nowhere")
    assert missing.value.status == 404
    assert len(attempts.sent) == 1, "a 404 is not retried"

    async with GroundingClient(live_url, "gsk_not_a_key") as stranger:
        with pytest.raises(grounding.Unauthorized) as unauthorized:
            await stranger.get_run("run_x")
    assert unauthorized.value.status == 401

    async with GroundingClient(live_url, secret(live_keys, "support")) as support:
        with pytest.raises(grounding.Forbidden) as forbidden:
            await support.cite(results_for(policy_chunks()))
    assert forbidden.value.status == 403

    async with GroundingClient(live_url, secret(live_keys, "agent", "globex")) as other:
        retrieved = await agent.cite([])
        with pytest.raises(grounding.NotFound):
            await other.get_run(retrieved.run_id)


async def test_a_503_is_retried_a_bounded_number_of_times_then_raised(
    unreachable_url: str, live_keys: Keys
) -> None:
    attempts = Attempts()
    async with attempts.client() as http:
        client = GroundingClient(
            unreachable_url, SOME_KEY, retries=2, max_retry_wait=0.05, http_client=http
        )
        started = time.monotonic()
        with pytest.raises(grounding.ServiceUnavailable) as raised:
            await client.get_run("run_x")
        elapsed = time.monotonic() - started

    assert attempts.sent == [("GET", "/v1/runs/run_x")] * 3
    assert raised.value.status == 503
    # Retry-After said 1 second; the client's cap of 0.05 seconds is what it waited.
    assert 0.1 <= elapsed < 1


async def test_a_write_answered_503_with_retry_after_is_retried_since_nothing_was_written(
    unreachable_url: str,
) -> None:
    attempts = Attempts()
    async with attempts.client() as http:
        client = GroundingClient(
            unreachable_url, SOME_KEY, retries=3, max_retry_wait=0.01, http_client=http
        )
        with pytest.raises(grounding.ServiceUnavailable):
            await client.cite(results_for(policy_chunks()))

    assert attempts.sent == [("POST", "/v1/runs")] * 4


async def test_retries_stop_when_the_time_budget_would_be_spent() -> None:
    sent: list[float] = []

    def unavailable(request: httpx.Request) -> httpx.Response:
        sent.append(time.monotonic())
        return httpx.Response(
            503, headers={"Retry-After": "1"}, json={"code": "service_unavailable"}
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(unavailable)) as http:
        client = GroundingClient(
            "http://grounding.test", SOME_KEY, retries=10, retry_budget=2.5, http_client=http
        )
        with pytest.raises(grounding.ServiceUnavailable):
            await client.excerpt("cit_x")

    # Attempts at 0, 1 and 2 seconds: a fourth would start at 3, past the budget of 2.5.
    assert len(sent) == 3
    assert sent[-1] - sent[0] < 2.5


async def test_a_connection_that_never_opened_is_retried_then_raised() -> None:
    attempts = Attempts()
    async with attempts.client() as http:
        client = GroundingClient(
            f"http://127.0.0.1:{closed_port()}",
            "gsk_any",
            retries=2,
            max_retry_wait=0.01,
            http_client=http,
        )
        with pytest.raises(grounding.ConnectionFailed) as raised:
            await client.cite(results_for(policy_chunks()))

    assert len(attempts.sent) == 3
    assert raised.value.status is None
    assert isinstance(raised.value.__cause__, httpx.ConnectError)


@contextmanager
def hanging_up() -> Iterator[tuple[str, list[int]]]:
    """A server that reads each request and closes the connection without answering."""
    received: list[int] = []
    ready = threading.Event()
    stop = threading.Event()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.05)

    def run() -> None:
        ready.set()
        while not stop.is_set():
            try:
                connection, _ = sock.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(5)
                if connection.recv(65536):
                    received.append(1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", received
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()


async def test_a_lost_answer_is_retried_and_a_write_keeps_its_key_on_every_attempt() -> None:
    attempts = Attempts()
    with hanging_up() as (url, received):
        async with attempts.client() as http:
            client = GroundingClient(
                url, "gsk_any", retries=2, max_retry_wait=0.01, http_client=http
            )
            for _ in range(2):
                with pytest.raises(grounding.ConnectionFailed):
                    await client.cite(results_for(policy_chunks()))
            with pytest.raises(grounding.ConnectionFailed):
                await client.resolve(["cit_x"])

    assert len(received) == 9
    first, second, resolve = attempts.keys[:3], attempts.keys[3:6], attempts.keys[6:]
    assert len(set(first)) == len(set(second)) == 1, "one key for every attempt of a call"
    assert first[0] is not None
    assert first[0] != second[0], "a key per call"
    assert resolve == [None] * 3, "a read needs no key"


class LosingFirstAnswer(httpx.AsyncBaseTransport):
    """Sends every request; the first answer, once the service has sent it, is lost."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lost: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if self.lost:
            return response
        self.lost.append(httpx.Response(200, content=await response.aread()).json())
        raise httpx.ReadError("connection reset", request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_write_whose_answer_was_lost_is_retried_and_recorded_once(
    live_url: str, live_keys: Keys, ingest: GroundingClient
) -> None:
    document_id = await registered(ingest)
    losing = LosingFirstAnswer()
    async with httpx.AsyncClient(transport=losing) as http:
        agent = GroundingClient(
            live_url, secret(live_keys, "agent"), max_retry_wait=0.01, http_client=http
        )
        retrieved = await agent.cite(results_for(policy_chunks(), document_id=document_id))

    [committed] = losing.lost
    assert retrieved.run_id == committed["run_id"]
    assert [c.citation_id for c in retrieved] == [c["citation_id"] for c in committed["citations"]]


def test_every_grounding_code_has_a_client_class_that_is_the_cores() -> None:
    assert {cls.code for cls in GROUNDING_ERRORS} == set(core.ERRORS_BY_CODE)
    for cls in GROUNDING_ERRORS:
        assert issubclass(cls, core.ERRORS_BY_CODE[cls.code])
        assert issubclass(cls, ServiceError)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (404, {"code": "not_found"}, grounding.NotFound),
        (422, {"code": "validation_error"}, grounding.ValidationFailed),
        (422, {"code": "idempotency_mismatch"}, grounding.IdempotencyMismatch),
        (413, {"code": "payload_too_large"}, grounding.PayloadTooLarge),
        (500, {"code": "integrity_error"}, grounding.InternalError),
        (502, {}, grounding.InternalError),
        (404, {"code": "something_new"}, grounding.NotFound),
        (418, {"code": "teapot"}, ServiceError),
    ],
)
def test_a_problem_is_raised_as_its_codes_class_else_its_statuss(
    status: int, body: dict[str, Any], expected: type[ServiceError]
) -> None:
    error = error_for(status, body)

    assert type(error) is expected
    assert error.status == status
