"""Bulk seeding with COPY: versions, chunks, runs, citations and audit entries, as the service
would have written them.

It writes as the database's owner, beside the service rather than through it: COPY into
`document_versions`, `version_keys`, `chunks`, `runs`, `citations` and `audit_entries`, one
transaction per batch. Row-level security is forced on those tables and its policies name only
the service's roles, so the owner must be a superuser or hold BYPASSRLS (the embedded server's
owner is a superuser).

The rows are what the service itself would have written: each version's text is its chunks'
texts in order, each chunk has its offsets in code points, UTF-8 and UTF-16 and its plain and
keyed hashes, each citation repeats its chunk's pin, and each run's audit entry carries the
content hash the service computes. Seeded citations therefore resolve to excerpts, seeded runs
verify answers, and seeded chunks can be cited again.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from app.audit.chain import content_sha256
from app.audit.service import run_content
from app.ids import new_id
from bench.payloads import BRANCHES, paragraph

CHUNKS_PER_VERSION = 200
CITATIONS_PER_RUN = 20
VERSIONS_PER_BATCH = 50

_VERSION_COLUMNS = (
    "tenant",
    "document_id",
    "version",
    "text",
    "sha256",
    "uri",
    "title",
    "chunk_count",
    "created_at",
)
_CHUNK_COLUMNS = (
    "tenant",
    "document_id",
    "version",
    "chunk_id",
    "ordinal",
    "span_start",
    "span_end",
    "utf8_start",
    "utf8_end",
    "utf16_start",
    "utf16_end",
    "page",
    "section",
    "uri",
    "text",
    "span_sha256",
    "span_hmac",
)
_RUN_COLUMNS = (
    "tenant",
    "run_id",
    "query",
    "scope",
    "retrieved_at",
    "key_id",
    "citation_count",
)
_CITATION_COLUMNS = (
    "tenant",
    "citation_id",
    "run_id",
    "ordinal",
    "document_id",
    "document_version",
    "chunk_id",
    "span_start",
    "span_end",
    "utf8_start",
    "utf8_end",
    "utf16_start",
    "utf16_end",
    "score",
    "branches",
    "retrieved_at",
    "uri",
    "page",
    "section",
    "span_sha256",
    "span_hmac",
)
_AUDIT_COLUMNS = ("tenant", "kind", "record_id", "content_sha256", "recorded_at")


@dataclass(frozen=True, slots=True)
class _Template:
    text: str
    utf8: int
    utf16: int


def _templates(count: int = 97) -> list[_Template]:
    rng = random.Random(97)
    made = []
    for _ in range(count):
        text = paragraph(rng, rng.randint(250, 550))
        made.append(
            _Template(
                text=text,
                utf8=len(text.encode("utf-8")),
                utf16=len(text.encode("utf-16-le")) // 2,
            )
        )
    return made


@dataclass(frozen=True, slots=True)
class SeedReport:
    """What one seeding step wrote, and how long it took."""

    versions: int
    chunks: int
    runs: int
    citations: int
    seconds: float

    @property
    def chunks_per_second(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0

    @property
    def rows_per_second(self) -> float:
        rows = 2 * self.versions + self.chunks + 2 * self.runs + self.citations
        return rows / self.seconds if self.seconds else 0.0


@dataclass
class Seeder:
    """Seeds one tenant's corpus and history in steps, each continuing where the last stopped."""

    tenant: str
    key_id: str
    rng: random.Random = field(default_factory=lambda: random.Random(1))
    versions: int = 0
    runs: int = 0
    _templates: list[_Template] = field(default_factory=_templates)
    _clock: datetime = field(default_factory=lambda: datetime.now(UTC) - timedelta(days=120))

    async def check_owner(self, connection: asyncpg.Connection) -> None:
        """Fail clearly unless this connection's role may COPY past row-level security."""
        bypasses = await connection.fetchval(
            "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        if not bypasses:
            raise SystemExit(
                "seeding needs the schema's owner as a superuser or with BYPASSRLS"
                " (row-level security is forced on the seeded tables)"
            )

    async def seed(
        self, url: str, *, chunks: int, citations: int, connections: int = 2
    ) -> SeedReport:
        """Add `chunks` chunks (in versions of 200) and `citations` citations (in runs of 20).

        Batches go over `connections` connections at once, so one batch is generated while
        the server writes another.
        """
        versions = -(-chunks // CHUNKS_PER_VERSION)
        runs = -(-citations // CITATIONS_PER_RUN)
        batches: list[tuple[int, int]] = []
        done_versions = done_runs = 0
        while done_versions < versions:
            batch = min(VERSIONS_PER_BATCH, versions - done_versions)
            # Spread the runs over the batches in proportion, so each batch cites its own chunks.
            runs_due = runs * (done_versions + batch) // versions - done_runs
            batches.append((batch, runs_due))
            done_versions += batch
            done_runs += runs_due
        pending = iter(batches)

        async def work() -> None:
            connection = await asyncpg.connect(url)
            try:
                await self.check_owner(connection)
                for batch_versions, batch_runs in pending:
                    async with connection.transaction():
                        await self._batch(connection, versions=batch_versions, runs=batch_runs)
            finally:
                await connection.close()

        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(connections):
                group.create_task(work())
        return SeedReport(
            versions=versions,
            chunks=versions * CHUNKS_PER_VERSION,
            runs=runs,
            citations=runs * CITATIONS_PER_RUN,
            seconds=time.perf_counter() - started,
        )

    async def _batch(self, connection: asyncpg.Connection, *, versions: int, runs: int) -> None:
        version_rows: list[tuple[Any, ...]] = []
        key_rows: list[tuple[Any, ...]] = []
        chunk_rows: list[tuple[Any, ...]] = []
        for _ in range(versions):
            number = self.versions
            self.versions += 1
            # Two versions of each document: the first is superseded by the second.
            document_id = f"handbook-{number // 2:06d}"
            version = f"2026-{number % 2 + 1:02d}"
            uri = f"https://handbook/{document_id}"
            key = secrets.token_bytes(32)
            texts = self._version_chunks(document_id, version, uri, key, number, chunk_rows)
            text = "".join(texts)
            version_rows.append(
                (
                    self.tenant,
                    document_id,
                    version,
                    text,
                    hashlib.sha256(text.encode("utf-8")).hexdigest(),
                    uri,
                    f"Handbook {number // 2}",
                    len(texts),
                    self._tick(seconds=600),
                )
            )
            key_rows.append((self.tenant, document_id, version, key))
            # Let the other connection's COPY go on while this batch is made.
            await asyncio.sleep(0)
        await connection.copy_records_to_table(
            "document_versions", records=version_rows, columns=_VERSION_COLUMNS
        )
        await connection.copy_records_to_table(
            "version_keys",
            records=key_rows,
            columns=("tenant", "document_id", "version", "hmac_key"),
        )
        await connection.copy_records_to_table("chunks", records=chunk_rows, columns=_CHUNK_COLUMNS)
        await self._runs(connection, chunk_rows, runs)

    def _version_chunks(
        self,
        document_id: str,
        version: str,
        uri: str,
        key: bytes,
        number: int,
        rows: list[tuple[Any, ...]],
    ) -> list[str]:
        texts = []
        start = utf8 = utf16 = 0
        for ordinal in range(CHUNKS_PER_VERSION):
            chunk_id = f"c{ordinal:04d}"
            template = self._templates[(number * 31 + ordinal) % len(self._templates)]
            prefix = f"{document_id} {version} {chunk_id}: "
            text = prefix + template.text
            encoded = text.encode("utf-8")
            rows.append(
                (
                    self.tenant,
                    document_id,
                    version,
                    chunk_id,
                    ordinal,
                    start,
                    start + len(text),
                    utf8,
                    utf8 + len(encoded),
                    utf16,
                    utf16 + len(prefix) + template.utf16,
                    ordinal // 4 + 1,
                    f"Section {ordinal // 20 + 1}",
                    None,
                    text,
                    hashlib.sha256(encoded).hexdigest(),
                    hmac.digest(key, encoded, "sha256").hex(),
                )
            )
            texts.append(text)
            start += len(text)
            utf8 += len(encoded)
            utf16 += len(prefix) + template.utf16
        return texts

    async def _runs(
        self, connection: asyncpg.Connection, chunks: Sequence[tuple[Any, ...]], runs: int
    ) -> None:
        run_rows: list[tuple[Any, ...]] = []
        citation_rows: list[tuple[Any, ...]] = []
        audit_rows: list[tuple[Any, ...]] = []
        branches = json.dumps(BRANCHES)
        for _ in range(runs):
            self.runs += 1
            retrieved_at = self._tick(seconds=120)
            run = {
                "tenant": self.tenant,
                "run_id": new_id("run"),
                "query": f"question {self.runs} about the handbook",
                "scope": "HANDBOOK",
                "retrieved_at": retrieved_at,
                "key_id": self.key_id,
                "citation_count": CITATIONS_PER_RUN,
            }
            cited = []
            for ordinal, chunk in enumerate(self.rng.sample(chunks, CITATIONS_PER_RUN)):
                citation = {
                    "tenant": self.tenant,
                    "citation_id": new_id("cit"),
                    "run_id": run["run_id"],
                    "ordinal": ordinal,
                    "document_id": chunk[1],
                    "document_version": chunk[2],
                    "chunk_id": chunk[3],
                    "span_start": chunk[5],
                    "span_end": chunk[6],
                    "utf8_start": chunk[7],
                    "utf8_end": chunk[8],
                    "utf16_start": chunk[9],
                    "utf16_end": chunk[10],
                    "score": round(0.95 - ordinal / 50, 4),
                    "branches": BRANCHES,
                    "retrieved_at": retrieved_at,
                    "uri": f"https://handbook/{chunk[1]}",
                    "page": chunk[11],
                    "section": chunk[12],
                    "span_sha256": chunk[15],
                    "span_hmac": chunk[16],
                }
                cited.append(citation)
                citation_rows.append(
                    tuple(branches if c == "branches" else citation[c] for c in _CITATION_COLUMNS)
                )
            run_rows.append(tuple(run[c] for c in _RUN_COLUMNS))
            digest = content_sha256(run_content(run, cited))
            audit_rows.append((self.tenant, "run", run["run_id"], digest, retrieved_at))
            if self.runs % 50 == 0:
                await asyncio.sleep(0)
        await connection.copy_records_to_table("runs", records=run_rows, columns=_RUN_COLUMNS)
        await connection.copy_records_to_table(
            "citations", records=citation_rows, columns=_CITATION_COLUMNS
        )
        await connection.copy_records_to_table(
            "audit_entries", records=audit_rows, columns=_AUDIT_COLUMNS
        )

    def _tick(self, *, seconds: int) -> datetime:
        self._clock += timedelta(seconds=seconds * self.rng.random())
        return self._clock
