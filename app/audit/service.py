"""The tamper-evident audit log: every run, verification, erasure and admin read, sealed in
checkpoints.

Invariants kept here:
- an audit record's entry is written in the transaction of the record itself, by an INSERT and
  nothing else: writers never wait on one another (no chain head to lock), and the service's
  role can neither update nor delete an entry;
- sealing takes, in one snapshot, every entry of the transactions that finished before the
  oldest still running one (the snapshot's xmin), so an entry committed late is sealed by the
  next checkpoint, never skipped;
- what is hashed for content that may be erased is its keyed hash (`span_hmac`), never its text
  nor a plain hash of it, so erasure never breaks the log;
- an admin read across tenants is recorded, its row and its entry, in the transaction of the
  read and before anything is read, so no read answers unrecorded;
- verifying recomputes every record's content hash, every entry's hash, every checkpoint's
  Merkle root and the chain, and reports the first entry that does not verify.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, literal_column, select, text
from sqlalchemy.dialects.postgresql import insert as upsert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ColumnElement

from app.audit.chain import (
    GENESIS,
    Entry,
    Problem,
    checkpoint_hash,
    compare_sealed,
    content_sha256,
    merkle_root,
    pack_leaves,
    unpack_leaves,
)
from app.ids import new_id
from app.models import (
    AdminRead,
    AuditCheckpoint,
    AuditEntry,
    CitationRow,
    Erasure,
    Run,
    Verification,
)

# The oldest transaction still running, as this statement's snapshot sees it.
_HORIZON: ColumnElement[int] = literal_column(
    "(pg_snapshot_xmin(pg_current_snapshot())::text)::bigint"
)

# The citation fields a run's entry covers: not `span_sha256`, which erasure removes.
_CITATION_FIELDS = (
    "citation_id",
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
    "span_hmac",
)
_RUN_FIELDS = ("run_id", "query", "scope", "retrieved_at", "key_id", "citation_count")
# A verification's columns, its tenant aside: what its entry covers, in the order of the
# statement that writes it (`app.answers.service`).
VERIFICATION_FIELDS = (
    "verification_id",
    "run_id",
    "key_id",
    "outcome",
    "code",
    "violations",
    "claims",
    "provenance",
    "claim_count",
    "citation_count",
    "answer_sha256",
    "created_at",
)
_ERASURE_FIELDS = (
    "erasure_id",
    "document_id",
    "versions",
    "reason",
    "request_ref",
    "key_id",
    "erased_at",
)
_ADMIN_READ_FIELDS = ("read_id", "key_id", "route", "filters", "read_at")


def run_content(run: Mapping[str, Any], citations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a run's entry covers: the run and its citations, in order, without plain hashes."""
    ordered = sorted(citations, key=lambda c: int(c["ordinal"]))
    return {
        **{f: run[f] for f in _RUN_FIELDS},
        "citations": [_citation_content(c) for c in ordered],
    }


def _citation_content(citation: Mapping[str, Any]) -> dict[str, Any]:
    content = {f: citation[f] for f in _CITATION_FIELDS}
    # Branch scores are floats, but jsonb gives one with no fraction back as an integer (1e16 as
    # 10000000000000000): as floats, what was written and what is read back hash alike.
    content["branches"] = {name: float(score) for name, score in citation["branches"].items()}
    return content


def verification_content(verification: Mapping[str, Any]) -> dict[str, Any]:
    """What a verification's entry covers: the whole record."""
    return {f: verification[f] for f in VERIFICATION_FIELDS}


def erasure_content(erasure: Mapping[str, Any]) -> dict[str, Any]:
    """What an erasure's entry covers: the whole record."""
    return {f: erasure[f] for f in _ERASURE_FIELDS}


def admin_read_content(read: Mapping[str, Any]) -> dict[str, Any]:
    """What an admin read's entry covers: the whole record."""
    return {f: read[f] for f in _ADMIN_READ_FIELDS}


def entry_insert(*, tenant: str, kind: str, record_id: str, content_sha256: str) -> str:
    """The INSERT of one audit entry, given the SQL expressions of its values: a writer ends the
    statement that writes the record with it (the record's INSERTs in its WITH), so the record
    and its entry take one round trip."""
    return (
        "INSERT INTO audit_entries (tenant, kind, record_id, content_sha256)"
        f" VALUES ({tenant}, {kind}, {record_id}, {content_sha256})"
    )


_RECORD = text(
    entry_insert(
        tenant=":tenant", kind=":kind", record_id=":record_id", content_sha256=":content_sha256"
    )
)


async def record(
    session: AsyncSession, *, tenant: str, kind: str, record_id: str, content: Mapping[str, Any]
) -> None:
    """Append the entry of one audit record, in the caller's transaction."""
    await session.execute(
        _RECORD,
        {
            "tenant": tenant,
            "kind": kind,
            "record_id": record_id,
            "content_sha256": content_sha256(content),
        },
    )


async def record_admin_read(
    session: AsyncSession, *, tenant: str, key_id: str, route: str, filters: Mapping[str, Any]
) -> str:
    """Record that admin key `key_id` (of `tenant`) read `route` across tenants, with the query
    parameters it sent; the caller must record before it reads. Answers the read's id."""
    values: dict[str, Any] = {
        "tenant": tenant,
        "read_id": new_id("read"),
        "key_id": key_id,
        "route": route,
        "filters": dict(filters),
        "read_at": datetime.now(UTC),
    }
    await session.execute(insert(AdminRead).values(values))
    await record(
        session,
        tenant=tenant,
        kind="admin_read",
        record_id=values["read_id"],
        content=admin_read_content(values),
    )
    return str(values["read_id"])


def _entry(row: Any) -> Entry:
    return Entry(
        tenant=row.tenant,
        seq=row.seq,
        xid=row.xid,
        kind=row.kind,
        record_id=row.record_id,
        content_sha256=row.content_sha256,
        recorded_at=row.recorded_at,
    )


_ENTRY_COLUMNS = (
    AuditEntry.tenant,
    AuditEntry.seq,
    AuditEntry.xid,
    AuditEntry.kind,
    AuditEntry.record_id,
    AuditEntry.content_sha256,
    AuditEntry.recorded_at,
)


async def _checkpoints(session: AsyncSession, tenant: str) -> list[AuditCheckpoint]:
    rows = await session.execute(
        select(AuditCheckpoint)
        .where(AuditCheckpoint.tenant == tenant)
        .order_by(AuditCheckpoint.number)
    )
    return list(rows.scalars())


async def seal(session: AsyncSession, *, tenant: str) -> AuditCheckpoint | None:
    """Seal the entries of every transaction finished before the oldest one still running."""
    checkpoints = await _checkpoints(session, tenant)
    last = checkpoints[-1] if checkpoints else None
    lower = last.horizon if last is not None else 0
    # One statement, so the entries and the horizon come from the same snapshot.
    rows = (
        await session.execute(
            select(
                *_ENTRY_COLUMNS,
                _HORIZON.label("horizon"),
            )
            .where(
                AuditEntry.tenant == tenant,
                AuditEntry.xid >= lower,
                AuditEntry.xid < _HORIZON,
            )
            .order_by(AuditEntry.seq)
        )
    ).all()
    if not rows:
        return None
    entries = [_entry(row) for row in rows]
    number = (last.number if last is not None else 0) + 1
    previous = last.checkpoint_hash if last is not None else GENESIS
    root = merkle_root([e.digest() for e in entries])
    values = {
        "tenant": tenant,
        "number": number,
        "horizon": rows[0].horizon,
        "entry_count": len(entries),
        "first_seq": entries[0].seq,
        "last_seq": entries[-1].seq,
        "root": root,
        "previous_hash": previous,
    }
    sealed = (
        await session.execute(
            upsert(AuditCheckpoint)
            .values(
                **values,
                leaf_hashes=pack_leaves(entries),
                checkpoint_hash=checkpoint_hash(**values),
            )
            # A concurrent sealer got there first: its checkpoint stands, this one is not needed.
            .on_conflict_do_nothing()
            .returning(AuditCheckpoint)
        )
    ).scalar_one_or_none()
    return sealed


@dataclass(frozen=True, slots=True)
class IntegrityReport:
    """What verifying the log checked, and the first entry that did not verify."""

    ok: bool
    entries: int
    sealed_entries: int
    checkpoints: int
    first_seq: int | None
    last_seq: int | None
    head: str
    first_bad: Problem | None


async def _recomputed_contents(
    session: AsyncSession, tenant: str, entries: Sequence[Entry]
) -> dict[tuple[str, str], str]:
    """The content hash of every record the entries name, recomputed from the tables."""
    wanted: dict[str, list[str]] = {}
    for entry in entries:
        wanted.setdefault(entry.kind, []).append(entry.record_id)
    found: dict[tuple[str, str], str] = {}
    if ids := wanted.get("run"):
        runs = await session.execute(select(Run).where(Run.tenant == tenant, Run.run_id.in_(ids)))
        citations: dict[str, list[dict[str, Any]]] = {}
        for citation in (
            await session.execute(
                select(CitationRow).where(CitationRow.tenant == tenant, CitationRow.run_id.in_(ids))
            )
        ).scalars():
            citations.setdefault(citation.run_id, []).append(row_values(citation))
        for run in runs.scalars():
            content = run_content(row_values(run), citations.get(run.run_id, []))
            found[("run", run.run_id)] = content_sha256(content)
    if ids := wanted.get("verification"):
        for verification in (
            await session.execute(
                select(Verification).where(
                    Verification.tenant == tenant, Verification.verification_id.in_(ids)
                )
            )
        ).scalars():
            content = verification_content(row_values(verification))
            found[("verification", verification.verification_id)] = content_sha256(content)
    if ids := wanted.get("erasure"):
        for erasure in (
            await session.execute(
                select(Erasure).where(Erasure.tenant == tenant, Erasure.erasure_id.in_(ids))
            )
        ).scalars():
            found[("erasure", erasure.erasure_id)] = content_sha256(
                erasure_content(row_values(erasure))
            )
    if ids := wanted.get("admin_read"):
        for read in (
            await session.execute(
                select(AdminRead).where(AdminRead.tenant == tenant, AdminRead.read_id.in_(ids))
            )
        ).scalars():
            found[("admin_read", read.read_id)] = content_sha256(
                admin_read_content(row_values(read))
            )
    return found


def row_values(row: Any) -> dict[str, Any]:
    """An ORM row's column values by name, as the content builders take them."""
    return {column.key: getattr(row, column.key) for column in row.__table__.columns}


async def verify(session: AsyncSession, *, tenant: str) -> IntegrityReport:
    """Seal what is pending, then recompute the whole log of `tenant` and report."""
    await seal(session, tenant=tenant)
    checkpoints = await _checkpoints(session, tenant)
    entries = [
        _entry(row)
        for row in await session.execute(
            select(*_ENTRY_COLUMNS).where(AuditEntry.tenant == tenant).order_by(AuditEntry.seq)
        )
    ]
    problems: list[Problem] = []
    previous, lower = GENESIS, 0
    for checkpoint in checkpoints:
        members = [e for e in entries if lower <= e.xid < checkpoint.horizon]
        stored = unpack_leaves(checkpoint.leaf_hashes)
        problems.extend(compare_sealed(stored, members))
        expected = checkpoint_hash(
            tenant=tenant,
            number=checkpoint.number,
            previous_hash=previous,
            root=merkle_root([leaf for _, leaf in stored]),
            entry_count=len(stored),
            horizon=checkpoint.horizon,
            first_seq=stored[0][0] if stored else 0,
            last_seq=stored[-1][0] if stored else 0,
        )
        if expected != checkpoint.checkpoint_hash:
            problems.append(Problem(seq=checkpoint.first_seq, problem="checkpoint_altered"))
        previous, lower = checkpoint.checkpoint_hash, checkpoint.horizon
    contents = await _recomputed_contents(session, tenant, entries)
    for entry in entries:
        recomputed = contents.get((entry.kind, entry.record_id))
        if recomputed is None:
            problems.append(Problem(entry.seq, "record_deleted", entry.kind, entry.record_id))
        elif recomputed != entry.content_sha256:
            problems.append(Problem(entry.seq, "record_altered", entry.kind, entry.record_id))
    first_bad = min(problems, key=lambda p: p.seq) if problems else None
    return IntegrityReport(
        ok=first_bad is None,
        entries=len(entries),
        sealed_entries=sum(c.entry_count for c in checkpoints),
        checkpoints=len(checkpoints),
        first_seq=entries[0].seq if entries else None,
        last_seq=entries[-1].seq if entries else None,
        head=previous,
        first_bad=first_bad,
    )
