"""`GroundingClient`: the seed's surface (`cite`, `check_grounding`, `excerpt`) over HTTP.

Invariants kept here:
- requests and answers are the service's own models (`app.grounding.models` and the schemas
  modules), never copies; answers are read ignoring fields this version does not know;
- a problem answer is raised as its code's class (see `app.client.errors`), never returned;
- every write carries an `Idempotency-Key`, so a retry never writes twice (`app.client.retries`);
- nothing is logged: a request or its answer may hold document text.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from app.answers.schemas import VerificationPassed, VerificationRead
from app.citations.schemas import ResolvedExcerpt, ResolvedTombstone, ResolveRead, Unresolved
from app.client.errors import ConnectionFailed, ServiceError, error_for
from app.client.retries import RetryPolicy, is_read, retry_after, should_retry
from app.documents.schemas import ChunkCreate, DocumentRead, ErasureRead, VersionRead
from app.grounding.cite import RetrievalResult
from app.grounding.models import AnswerCitation, Citation, CitedAnswer, Excerpt, Tombstone
from app.memory.schemas import MemoryRead, MemoryWithCitations
from app.runs.schemas import RunRead

Model = TypeVar("Model", bound=BaseModel)
Resolved = ResolvedExcerpt | ResolvedTombstone | Unresolved
# A citation as issued, as an answer carries it, or its id.
CitationRef = Citation | AnswerCitation | str
IDEMPOTENCY_KEY = "Idempotency-Key"
_EXCERPT_OR_TOMBSTONE: TypeAdapter[Excerpt | Tombstone] = TypeAdapter(Excerpt | Tombstone)


class RetrievedRun(Sequence[Citation]):
    """A recorded run: its citations in the order of its results, with the run's `run_id`."""

    def __init__(self, run: RunRead) -> None:
        self.run = run

    @property
    def run_id(self) -> str:
        """The id `check_grounding` verifies an answer against."""
        return self.run.run_id

    @property
    def tenant(self) -> str:
        """The tenant the run (and every citation) belongs to."""
        return self.run.tenant

    @property
    def retrieved_at(self) -> datetime:
        """When the run was recorded."""
        return self.run.retrieved_at

    @property
    def citations(self) -> list[Citation]:
        """The citations, in the order of the run's results."""
        return self.run.citations

    @overload
    def __getitem__(self, index: int) -> Citation: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Citation]: ...

    def __getitem__(self, index: int | slice) -> Citation | Sequence[Citation]:
        return self.run.citations[index]

    def __len__(self) -> int:
        return len(self.run.citations)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetrievedRun) and other.run == self.run

    def __repr__(self) -> str:
        return f"RetrievedRun(run_id={self.run_id!r}, citations={len(self)})"


class GroundingClient:
    """An async client of the grounding service; use it as `async with GroundingClient(...)`.

    `http_client`, when given, carries the requests (its transport, hooks and limits) and is
    left open; otherwise the client owns one and closes it on exit.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        retry_budget: float = 30.0,
        max_retry_wait: float = 10.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json, application/problem+json",
        }
        self._timeout = httpx.Timeout(timeout)
        self.retry_policy = RetryPolicy(
            retries=max(0, retries), budget=retry_budget, max_wait=max_retry_wait
        )
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.AsyncClient()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client, if this client opened it."""
        if self._owns_http:
            await self._http.aclose()

    async def register_version(
        self,
        document_id: str,
        *,
        version: str,
        text: str,
        chunks: Iterable[ChunkCreate | Mapping[str, Any]],
        uri: str | None = None,
        title: str | None = None,
    ) -> VersionRead:
        """Register a version of a document; the same content again is a no-op."""
        body = {
            "version": version,
            "text": text,
            "uri": uri,
            "title": title,
            "chunks": [_plain(chunk) for chunk in chunks],
        }
        return await self._call(
            VersionRead, "POST", f"/v1/documents/{_part(document_id)}/versions", body
        )

    async def get_document(self, document_id: str) -> DocumentRead:
        """A document's versions, erased or not."""
        return await self._call(DocumentRead, "GET", f"/v1/documents/{_part(document_id)}")

    async def erase(
        self,
        document_id: str,
        *,
        reason: str,
        request_ref: str,
        versions: Sequence[str] | None = None,
    ) -> ErasureRead:
        """Erase all (or the named) versions of a document; erasing again changes nothing."""
        body: dict[str, Any] = {"reason": reason, "request_ref": request_ref}
        if versions is not None:
            body["versions"] = list(versions)
        return await self._call(
            ErasureRead, "POST", f"/v1/documents/{_part(document_id)}/erase", body
        )

    async def cite(
        self,
        results: Iterable[RetrievalResult | Mapping[str, Any]],
        *,
        query: str | None = None,
        scope: str | None = None,
    ) -> RetrievedRun:
        """Record a retrieval run; its citations, one per result, in order."""
        body = {"query": query, "scope": scope, "results": [_plain(r) for r in results]}
        return RetrievedRun(await self._call(RunRead, "POST", "/v1/runs", body))

    async def get_run(self, run_id: str) -> RetrievedRun:
        """A recorded run and its citations."""
        return RetrievedRun(await self._call(RunRead, "GET", f"/v1/runs/{_part(run_id)}"))

    async def check_grounding(
        self, answer: CitedAnswer, retrieved: RetrievedRun | str
    ) -> VerificationPassed:
        """Verify `answer` against the run; the recorded verification, or the rejection raised."""
        run_id = retrieved if isinstance(retrieved, str) else retrieved.run_id
        body = answer.model_dump(mode="json", exclude_none=True)
        return await self._call(
            VerificationPassed, "POST", f"/v1/runs/{_part(run_id)}/answers", body
        )

    async def get_verification(self, verification_id: str) -> VerificationRead:
        """A recorded verification, passed or rejected."""
        return await self._call(VerificationRead, "GET", f"/v1/answers/{_part(verification_id)}")

    async def get_citation(self, citation_id: str) -> Citation:
        """One issued citation."""
        return await self._call(Citation, "GET", f"/v1/citations/{_part(citation_id)}")

    async def excerpt(self, citation: CitationRef) -> Excerpt | Tombstone:
        """The exact characters a citation pinned, or its tombstone once they were erased."""
        citation_id = _citation_id(citation)
        data = await self._request("GET", f"/v1/citations/{_part(citation_id)}/excerpt")
        return _EXCERPT_OR_TOMBSTONE.validate_python(data, extra="ignore")

    async def resolve(self, citations: Iterable[CitationRef]) -> list[Resolved]:
        """Each citation as an excerpt, a tombstone or not found, in the order asked."""
        body = {"citation_ids": [_citation_id(c) for c in citations]}
        return (await self._call(ResolveRead, "POST", "/v1/citations/resolve", body)).results

    async def remember(
        self,
        text: str,
        *,
        citations: Iterable[CitationRef] | None = None,
        verification: VerificationPassed | str | None = None,
    ) -> MemoryRead:
        """Write `text` back to memory with what it came from: citations, or a verification."""
        body: dict[str, Any] = {"text": text}
        if citations is not None:
            body["citation_ids"] = [_citation_id(c) for c in citations]
        if verification is not None:
            body["verification_id"] = (
                verification if isinstance(verification, str) else verification.verification_id
            )
        return await self._call(MemoryRead, "POST", "/v1/memory", body)

    async def get_memory(self, memory_id: str) -> MemoryWithCitations:
        """A memory record with each of its citations resolved (tombstones included)."""
        return await self._call(MemoryWithCitations, "GET", f"/v1/memory/{_part(memory_id)}")

    async def _call(self, model: type[Model], method: str, path: str, body: Any = None) -> Model:
        return model.model_validate(await self._request(method, path, body), extra="ignore")

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        """The answer's JSON, after the retries the policy allows; a problem raised."""
        policy = self.retry_policy
        started = time.monotonic()
        attempt = 0
        headers = self._headers
        if not is_read(method, path):
            # One key for every attempt of this call: a repeat is answered as the first was.
            headers = headers | {IDEMPOTENCY_KEY: uuid.uuid4().hex}
        while True:
            cause: httpx.TransportError | None = None
            try:
                response = await self._http.request(
                    method,
                    self._base_url + path,
                    json=body,
                    headers=headers,
                    timeout=self._timeout,
                )
            except httpx.TransportError as exc:
                cause = exc
                error: ServiceError = ConnectionFailed(
                    f"the service did not answer ({type(exc).__name__})"
                )
                repeatable = True
                asked = None
            else:
                if response.is_success:
                    return response.json()
                error = _problem(response)
                repeatable = should_retry(response)
                asked = retry_after(response)
            wait = policy.wait(attempt, asked)
            if not repeatable or not policy.allows(attempt, time.monotonic() - started, wait):
                raise error from cause
            await asyncio.sleep(wait)
            attempt += 1


def _problem(response: httpx.Response) -> ServiceError:
    try:
        body = response.json()
    except ValueError:
        body = None
    return error_for(
        response.status_code,
        body if isinstance(body, dict) else {},
        request_id=response.headers.get("x-request-id"),
    )


def _plain(value: BaseModel | Mapping[str, Any]) -> Any:
    """A request item as JSON: a model dumped, a mapping sent as given for the service to judge."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)


def _citation_id(citation: CitationRef) -> str:
    return citation if isinstance(citation, str) else citation.citation_id


def _part(value: str) -> str:
    """`value` as one path segment."""
    return quote(value, safe="")
