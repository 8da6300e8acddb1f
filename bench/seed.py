"""Bulk seeding with COPY: versions, chunks, runs, citations and audit entries, as the service
would have written them.

It writes as the database's owner, beside the service rather than through it: binary COPY into
`document_versions`, `version_keys`, `chunks`, `runs`, `citations` and `audit_entries`, one
transaction per batch, over two connections at once on disjoint documents (one batch is made
while the server writes another). Row-level security is forced on those tables and its policies
name only the service's roles, so the owner must be a superuser or hold BYPASSRLS (the embedded
server's owner is a superuser).

The rows are what the service itself would have written: each version's text is its chunks'
texts in order, each chunk has its offsets in code points, UTF-8 and UTF-16 and its plain and
keyed hashes, each citation repeats its chunk's pin, and each run's audit entry carries the
content hash the service computes. Seeded citations therefore resolve to excerpts, seeded runs
verify answers, and seeded chunks can be cited again.

What makes it fast, and what it leaves alone:
- the server does most of the work (compressing each version's text with the schema's method,
  lz4 where the server has it and pglz where not; index entries; WAL), so the rows are made
  with as little Python as they can be: per-template text and lengths computed once, each
  version key's HMAC pads hashed once, ids from one draw of random bytes per batch, and each
  run's canonical content filled into a format made once from the audit log's own
  `run_content` and `canonical`, so the hash is the service's without building its
  dictionaries;
- the seeding sessions only (`SET`, never `ALTER SYSTEM`) commit without waiting for the WAL
  flush, and, as a superuser, make new WAL segments without filling them with zeros first
  (`wal_init_zero = off`) and run with `session_replication_role = replica`, which skips the
  per-row foreign-key triggers: the rows are built parents first in each transaction, so
  those checks would pass, and nothing else differs (no other triggers may exist on the
  seeded tables, or the checks stay on; the tests check every key of a seeded corpus).
  The schema, its indexes, constraints and row-level security are untouched.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import operator
import random
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from app.audit.chain import canonical
from app.audit.service import run_content
from bench.payloads import BRANCHES, paragraph

CHUNKS_PER_VERSION = 200
CITATIONS_PER_RUN = 20
VERSIONS_PER_BATCH = 50
SEEDED_TABLES = (
    "document_versions",
    "version_keys",
    "chunks",
    "runs",
    "citations",
    "audit_entries",
)
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
# What a run's and a citation's canonical forms are filled from: a run's own values, and a
# citation's after its chunk's row.
_RUN_ITEMS = (*_RUN_COLUMNS, "citations")
_CITATION_ITEMS = ("citation_id", "ordinal", "score", "branches", "retrieved_at", "uri")
_PLACEHOLDER = re.compile(r'"\\u0000(\w+)\\u0000"')


@dataclass(frozen=True, slots=True)
class _Template:
    text: str
    encoded: bytes
    length: int
    utf16: int


def _templates(count: int = 97) -> list[_Template]:
    rng = random.Random(97)
    made = []
    for _ in range(count):
        text = paragraph(rng, rng.randint(250, 550))
        made.append(
            _Template(
                text=text,
                encoded=text.encode("utf-8"),
                length=len(text),
                utf16=len(text.encode("utf-16-le")) // 2,
            )
        )
    return made


@dataclass(frozen=True, slots=True)
class _Form:
    """A record's canonical JSON as a `%` format, for records of one shape.

    Made from a sample record and the names of a row's items: each field takes the item named
    like it (or as `sources` says), inside quotes where the sample's value is a string. Filled
    from a row whose values need no JSON escaping, it is their canonical JSON: ints and floats
    format as JSON does, and any other value is given as its JSON text.
    """

    template: str
    pick: Callable[[Sequence[Any]], tuple[Any, ...]]

    @classmethod
    def of(
        cls, sample: dict[str, Any], items: Sequence[str], sources: dict[str, str] | None = None
    ) -> _Form:
        # Each value a marker the canonical form escapes, so only the markers are replaced.
        text = canonical({f: f"\0{f}\0" for f in sample}).decode("utf-8").replace("%", "%%")
        order = []

        def slot(found: re.Match[str]) -> str:
            name = found[1]
            order.append(items.index((sources or {}).get(name, name)))
            return '"%s"' if isinstance(sample[name], str) else "%s"

        template = _PLACEHOLDER.sub(slot, text)
        return cls(template=template, pick=operator.itemgetter(*order))

    def fill(self, row: Sequence[Any]) -> str:
        """The canonical JSON of the record in `row`."""
        return self.template % self.pick(row)


def _keyed(inner: Any, outer: Any, message: bytes) -> str:
    """HMAC-SHA256 of `message` as hex, given the hash states of the padded key."""
    hashed = inner.copy()
    hashed.update(message)
    keyed = outer.copy()
    keyed.update(hashed.digest())
    return str(keyed.hexdigest())


def _json(value: Any) -> str:
    return canonical(value).decode("utf-8")


def _ids(prefix: str, count: int) -> list[str]:
    """`count` ids as `app.ids.new_id` makes them (128 random bits), from one draw of bytes."""
    drawn = memoryview(secrets.token_bytes(16 * count))
    # Two zero bytes after each id's 16 make 24 characters each, the first 22 its own.
    spaced = b"\0\0".join([drawn[i : i + 16] for i in range(0, 16 * count, 16)]) + b"\0\0"
    text = base64.urlsafe_b64encode(spaced).decode("ascii")
    return [f"{prefix}_{text[i : i + 22]}" for i in range(0, 24 * count, 24)]


@dataclass(frozen=True, slots=True)
class SeedReport:
    """What one seeding step wrote, how long it took, and whether the server checked each
    row's foreign keys (it does not when the owner may skip the triggers)."""

    versions: int
    chunks: int
    runs: int
    citations: int
    seconds: float
    foreign_key_checks: bool = True

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

    def __post_init__(self) -> None:
        self._chunk_ids = [f"c{ordinal:04d}" for ordinal in range(CHUNKS_PER_VERSION)]
        self._pages = [ordinal // 4 + 1 for ordinal in range(CHUNKS_PER_VERSION)]
        self._sections = [f"Section {ordinal // 20 + 1}" for ordinal in range(CHUNKS_PER_VERSION)]
        self._scores = [round(0.95 - ordinal / 50, 4) for ordinal in range(CITATIONS_PER_RUN)]
        self._branches = json.dumps(BRANCHES)
        self._json_branches = _json(BRANCHES)
        # The forms are read off the audit log's own projection, so they follow its fields. A
        # citation's form takes the values it shares with its chunk from the chunk's row.
        run = dict.fromkeys(_RUN_COLUMNS, "") | {"citation_count": 0, "citations": []}
        citation = dict.fromkeys(_CITATION_COLUMNS, "") | {
            "ordinal": 0,
            "score": 0.0,
            "branches": {},
        }
        citation.update(dict.fromkeys(("span_start", "span_end", "page"), 0))
        citation.update(dict.fromkeys(("utf8_start", "utf8_end", "utf16_start", "utf16_end"), 0))
        content = run_content(run, [citation])
        self._run_form = _Form.of(content, _RUN_ITEMS)
        shared = {f: f"chunk.{f}" for f in content["citations"][0] if f not in _CITATION_ITEMS}
        self._citation_form = _Form.of(
            content["citations"][0],
            (*(f"chunk.{c}" for c in _CHUNK_COLUMNS), *_CITATION_ITEMS),
            shared | {"document_version": "chunk.version"},
        )

    async def _prepare(self, connection: asyncpg.Connection) -> bool:
        """Fail clearly unless this connection's role may COPY past row-level security; set
        the session up for bulk loading; answer whether the server checks foreign keys."""
        role = await connection.fetchrow(
            "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        if not (role["rolsuper"] or role["rolbypassrls"]):
            raise SystemExit(
                "seeding needs the schema's owner as a superuser or with BYPASSRLS"
                " (row-level security is forced on the seeded tables)"
            )
        await connection.execute("SET synchronous_commit = off")
        if not role["rolsuper"]:
            return True
        # A new WAL segment is made by writing its last byte, not 16 MB of zeros before its WAL:
        # a million chunks write about 2 GB of WAL, which would otherwise be written twice.
        await connection.execute("SET wal_init_zero = off")
        other_triggers = await connection.fetchval(
            "SELECT count(*) FROM pg_trigger"
            " WHERE NOT tgisinternal AND tgrelid = ANY($1::text[]::regclass[])",
            list(SEEDED_TABLES),
        )
        if other_triggers:
            return True
        await connection.execute("SET session_replication_role = replica")
        return False

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
        checked: list[bool] = []

        async def work() -> None:
            connection = await asyncpg.connect(url)
            try:
                checked.append(await self._prepare(connection))
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
            foreign_key_checks=any(checked),
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
            key = secrets.token_bytes(32)
            text, digest = self._version_chunks(document_id, version, key, number, chunk_rows)
            version_rows.append(
                (
                    self.tenant,
                    document_id,
                    version,
                    text,
                    digest,
                    f"https://handbook/{document_id}",
                    f"Handbook {number // 2}",
                    CHUNKS_PER_VERSION,
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
        key: bytes,
        number: int,
        rows: list[tuple[Any, ...]],
    ) -> tuple[str, str]:
        """Append the version's chunk rows to `rows`; answer its text and the text's hash."""
        tenant, templates, chunk_ids = self.tenant, self._templates, self._chunk_ids
        pages, sections = self._pages, self._sections
        head = f"{document_id} {version} "
        # HMAC-SHA256 (RFC 2104) from the key's padded states, hashed once per version.
        padded = key.ljust(64, b"\0")
        inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
        outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
        texts = []
        whole = hashlib.sha256()
        start = utf8 = utf16 = 0
        for ordinal in range(CHUNKS_PER_VERSION):
            chunk_id = chunk_ids[ordinal]
            template = templates[(number * 31 + ordinal) % len(templates)]
            # The prefix is ASCII: one code point, one byte and one UTF-16 unit per character.
            prefix = f"{head}{chunk_id}: "
            text = prefix + template.text
            encoded = prefix.encode("ascii") + template.encoded
            whole.update(encoded)
            size = len(prefix)
            end = start + size + template.length
            utf8_end = utf8 + len(encoded)
            utf16_end = utf16 + size + template.utf16
            rows.append(
                (
                    tenant,
                    document_id,
                    version,
                    chunk_id,
                    ordinal,
                    start,
                    end,
                    utf8,
                    utf8_end,
                    utf16,
                    utf16_end,
                    pages[ordinal],
                    sections[ordinal],
                    text,
                    hashlib.sha256(encoded).hexdigest(),
                    _keyed(inner, outer, encoded),
                )
            )
            texts.append(text)
            start, utf8, utf16 = end, utf8_end, utf16_end
        return "".join(texts), whole.hexdigest()

    async def _runs(
        self, connection: asyncpg.Connection, chunks: list[tuple[Any, ...]], runs: int
    ) -> None:
        run_rows: list[tuple[Any, ...]] = []
        citation_rows: list[tuple[Any, ...]] = []
        audit_rows: list[tuple[Any, ...]] = []
        tenant, key_id, branches, scores = self.tenant, self.key_id, self._branches, self._scores
        json_branches = self._json_branches
        run_form, citation_form = self._run_form.fill, self._citation_form.fill
        run_ids = _ids("run", runs)
        citation_ids = iter(_ids("cit", runs * CITATIONS_PER_RUN))
        picks = range(len(chunks))
        for made, run_id in enumerate(run_ids, start=1):
            self.runs += 1
            retrieved_at = self._tick(seconds=120)
            when = retrieved_at.astimezone(UTC).isoformat()
            query = f"question {self.runs} about the handbook"
            cited = []
            for ordinal, pick in enumerate(self.rng.sample(picks, CITATIONS_PER_RUN)):
                chunk = chunks[pick]
                citation_id = next(citation_ids)
                uri = f"https://handbook/{chunk[1]}"
                score = scores[ordinal]
                citation_rows.append(
                    (
                        tenant,
                        citation_id,
                        run_id,
                        ordinal,
                        # The chunk's pin: document, version and id (not its ordinal), offsets.
                        *chunk[1:4],
                        *chunk[5:11],
                        score,
                        branches,
                        retrieved_at,
                        uri,
                        *chunk[11:13],
                        *chunk[14:16],
                    )
                )
                cited.append(
                    citation_form((*chunk, citation_id, ordinal, score, json_branches, when, uri))
                )
            run_row = (tenant, run_id, query, "HANDBOOK", retrieved_at, key_id, CITATIONS_PER_RUN)
            run_rows.append(run_row)
            content = run_form((*run_row[:4], when, *run_row[5:], f"[{','.join(cited)}]"))
            digest = hashlib.sha256(content.encode("utf-8")).hexdigest()
            audit_rows.append((tenant, "run", run_id, digest, retrieved_at))
            if made % 50 == 0:
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
