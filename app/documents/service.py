"""The corpus registry: immutable document versions, their chunks, and right-to-erasure.

Invariants kept here:
- a version, once registered, never changes: the same content again is a no-op, any
  difference is a conflict, and an erased version cannot be registered again;
- a chunk is a span of its version's text, with a unique id in that version;
- erasure removes every copy of the text and every plain hash of it (version, chunks,
  citations) and destroys the key of the keyed hashes, in one transaction, keeping a tombstone;
  erasing again answers the erasure that already happened;
- once an erasure has committed, the tables it rewrote are vacuumed, best effort, so the dead
  rows that still hold the text are reclaimed now rather than whenever autovacuum comes by.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool

from app import telemetry
from app.access.service import Principal
from app.audit import service as audit
from app.config import Settings
from app.db import async_url
from app.documents.schemas import ChunkCreate, ErasureCreate, VersionCreate
from app.errors import InvalidRequest, NotFound, VersionConflict, enforce_limit
from app.grounding.cite import ChunkBounds, chunk_problems, pin_chunks
from app.idempotency import service as idempotency
from app.ids import new_id
from app.models import Chunk, CitationRow, DocumentVersion, Erasure, VersionKey

logger = logging.getLogger(__name__)

# Every table an erasure updates or deletes from: each keeps the old row versions, text and
# plain hashes included, as dead tuples until VACUUM. Then `pg_statistic`, because ANALYZE
# replaces its rows of sampled column values (which can be erased text or hashes) the same way.
VACUUMED_AFTER_ERASURE: Final = (
    "document_versions",
    "chunks",
    "citations",
    "version_keys",
    "idempotency_keys",
    "pg_catalog.pg_statistic",
)


@dataclass(frozen=True, slots=True)
class ErasureResult:
    """An erasure and whether this request carried it out (or answered one already done)."""

    erasure: Erasure
    created: bool


@dataclass(frozen=True, slots=True)
class Registration:
    """A registered version and whether this request created it."""

    version: DocumentVersion
    created: bool


def _bounds(chunks: Sequence[ChunkCreate]) -> list[ChunkBounds]:
    return [
        ChunkBounds(
            chunk_id=c.chunk_id, start=c.start, end=c.end, page=c.page, section=c.section, uri=c.uri
        )
        for c in chunks
    ]


async def register_version(
    session: AsyncSession,
    *,
    principal: Principal,
    document_id: str,
    body: VersionCreate,
    settings: Settings,
) -> Registration:
    """Register a version with its chunks, or recognise the same registration again."""
    enforce_limit("text length", len(body.text), settings.max_text_chars)
    enforce_limit("chunks per version", len(body.chunks), settings.max_chunks_per_version)
    bounds = _bounds(body.chunks)
    problems = chunk_problems(body.text, bounds)
    if problems:
        raise InvalidRequest("some chunks are not spans of the text", errors=problems)
    sha256 = hashlib.sha256(body.text.encode("utf-8")).hexdigest()
    inserted = (
        await session.execute(
            insert(DocumentVersion)
            .values(
                tenant=principal.tenant,
                document_id=document_id,
                version=body.version,
                text=body.text,
                sha256=sha256,
                uri=body.uri,
                title=body.title,
                chunk_count=len(bounds),
            )
            .on_conflict_do_nothing()
            .returning(DocumentVersion)
        )
    ).scalar_one_or_none()
    if inserted is None:
        existing = await _locked_version(session, principal.tenant, document_id, body.version)
        await _ensure_same_content(session, existing, body, sha256)
        return Registration(version=existing, created=False)
    hmac_key = secrets.token_bytes(32)
    session.add(
        VersionKey(
            tenant=principal.tenant,
            document_id=document_id,
            version=body.version,
            hmac_key=hmac_key,
        )
    )
    pinned = pin_chunks(body.text, bounds, hmac_key=hmac_key)
    if pinned:
        await session.execute(
            insert(Chunk),
            [
                {
                    "tenant": principal.tenant,
                    "document_id": document_id,
                    "version": body.version,
                    "chunk_id": chunk.chunk_id,
                    "ordinal": ordinal,
                    "span_start": chunk.start,
                    "span_end": chunk.end,
                    "utf8_start": chunk.utf8_start,
                    "utf8_end": chunk.utf8_end,
                    "utf16_start": chunk.utf16_start,
                    "utf16_end": chunk.utf16_end,
                    "page": chunk.page,
                    "section": chunk.section,
                    "uri": chunk.uri,
                    "text": body.text[chunk.start : chunk.end],
                    "span_sha256": chunk.span_sha256,
                    "span_hmac": chunk.span_hmac,
                }
                for ordinal, chunk in enumerate(pinned)
            ],
        )
    await session.flush()
    return Registration(version=inserted, created=True)


async def _locked_version(
    session: AsyncSession, tenant: str, document_id: str, version: str
) -> DocumentVersion:
    return (
        await session.execute(
            select(DocumentVersion)
            .where(
                DocumentVersion.tenant == tenant,
                DocumentVersion.document_id == document_id,
                DocumentVersion.version == version,
            )
            .with_for_update()
        )
    ).scalar_one()


async def _ensure_same_content(
    session: AsyncSession, existing: DocumentVersion, body: VersionCreate, sha256: str
) -> None:
    if existing.erased_at is not None:
        raise VersionConflict("this version was erased; register a new version instead")
    if (existing.sha256, existing.title, existing.uri) != (sha256, body.title, body.uri):
        raise VersionConflict("this version is registered with different content")
    stored = await session.execute(
        select(
            Chunk.chunk_id, Chunk.span_start, Chunk.span_end, Chunk.page, Chunk.section, Chunk.uri
        ).where(
            Chunk.tenant == existing.tenant,
            Chunk.document_id == existing.document_id,
            Chunk.version == existing.version,
        )
    )
    given = {(c.chunk_id, c.start, c.end, c.page, c.section, c.uri) for c in body.chunks}
    if {tuple(row) for row in stored} != given or len(given) != len(body.chunks):
        raise VersionConflict("this version is registered with different chunks")


async def get_document(
    session: AsyncSession, *, principal: Principal, document_id: str
) -> list[DocumentVersion]:
    """Every version of a document, in registration order, erased ones included."""
    versions = list(
        (
            await session.execute(
                select(DocumentVersion)
                .where(
                    DocumentVersion.tenant == principal.tenant,
                    DocumentVersion.document_id == document_id,
                )
                .order_by(DocumentVersion.seq)
            )
        ).scalars()
    )
    if not versions:
        raise NotFound("no such document")
    return versions


@telemetry.traced("grounding.erase")
async def erase(
    session: AsyncSession, *, principal: Principal, document_id: str, body: ErasureCreate
) -> ErasureResult:
    """Erase the named versions (all when none are named), or answer the erasure already done."""
    tenant = principal.tenant
    query = (
        select(DocumentVersion.version, DocumentVersion.erasure_id)
        .where(DocumentVersion.tenant == tenant, DocumentVersion.document_id == document_id)
        .order_by(DocumentVersion.seq)
        .with_for_update()
    )
    if body.versions is not None:
        query = query.where(DocumentVersion.version.in_(body.versions))
    targets = (await session.execute(query)).all()
    if not targets:
        raise NotFound("no such document")
    unknown = sorted(set(body.versions or ()) - {t.version for t in targets})
    if unknown:
        raise NotFound("no such version of this document", versions=unknown)
    pending = [t.version for t in targets if t.erasure_id is None]
    telemetry.annotate(
        {
            "adk.grounding.outcome": "erased" if pending else "already_erased",
            "adk.erasure.document_id": document_id,
            "adk.erasure.document_versions": [f"{document_id}@{v}" for v in pending],
            "adk.erasure.version_count": len(pending),
        }
    )
    if not pending:
        done = await _latest_erasure(session, tenant, {t.erasure_id for t in targets})
        return ErasureResult(erasure=done, created=False)
    erasure = Erasure(
        tenant=tenant,
        erasure_id=new_id("era"),
        document_id=document_id,
        versions=pending,
        reason=body.reason,
        request_ref=body.request_ref,
        key_id=principal.key_id,
        erased_at=datetime.now(UTC),
    )
    session.add(erasure)
    await session.flush()
    await _remove_text(session, tenant, document_id, pending, erasure)
    await idempotency.forget_document(session, tenant=tenant, document_id=document_id)
    await audit.record(
        session,
        tenant=tenant,
        kind="erasure",
        record_id=erasure.erasure_id,
        content=audit.erasure_content(audit.row_values(erasure)),
    )
    return ErasureResult(erasure=erasure, created=True)


async def _remove_text(
    session: AsyncSession, tenant: str, document_id: str, versions: list[str], erasure: Erasure
) -> None:
    await session.execute(
        update(DocumentVersion)
        .where(
            DocumentVersion.tenant == tenant,
            DocumentVersion.document_id == document_id,
            DocumentVersion.version.in_(versions),
        )
        .values(text=None, sha256=None, erased_at=erasure.erased_at, erasure_id=erasure.erasure_id)
    )
    await session.execute(
        update(Chunk)
        .where(
            Chunk.tenant == tenant, Chunk.document_id == document_id, Chunk.version.in_(versions)
        )
        .values(text=None, span_sha256=None)
    )
    await session.execute(
        update(CitationRow)
        .where(
            CitationRow.tenant == tenant,
            CitationRow.document_id == document_id,
            CitationRow.document_version.in_(versions),
        )
        .values(span_sha256=None)
    )
    await session.execute(
        delete(VersionKey).where(
            VersionKey.tenant == tenant,
            VersionKey.document_id == document_id,
            VersionKey.version.in_(versions),
        )
    )


async def _latest_erasure(
    session: AsyncSession, tenant: str, erasure_ids: set[str | None]
) -> Erasure:
    return (
        await session.execute(
            select(Erasure)
            .where(Erasure.tenant == tenant, Erasure.erasure_id.in_(erasure_ids - {None}))
            .order_by(Erasure.erased_at.desc())
            .limit(1)
        )
    ).scalar_one()


def commits_for_real(session: AsyncSession) -> bool:
    """Whether the session's commit is a real one, on a connection of its own from an engine.

    A session joined to a connection inside an enclosing transaction commits only a savepoint,
    so a vacuum after its response would find nothing of the erasure to reclaim yet.
    """
    return isinstance(session.bind, AsyncEngine)


async def vacuum_after_erasure(
    settings: Settings, *, tables: Sequence[str] = VACUUMED_AFTER_ERASURE
) -> None:
    """Best effort, after an erasure commits: VACUUM (and ANALYZE) the tables it rewrote.

    VACUUM needs the tables' owner (requests run as a role that owns nothing) and cannot run in
    a transaction, so this opens one autocommit connection of its own as `DATABASE_URL`'s role.
    Failures are logged by table name and exception type only, and never raised: the erasure
    has already committed, and autovacuum reclaims the rows later.
    """
    if settings.database_url is None:
        return
    engine = create_async_engine(
        async_url(settings.database_url),
        poolclass=NullPool,
        hide_parameters=True,
        connect_args={"timeout": settings.db_connect_timeout},
    )
    try:
        async with engine.connect() as connection:
            autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
            for table in tables:
                try:
                    # SKIP_LOCKED: a vacuum already running on the table is not waited for.
                    await autocommit.execute(text(f"VACUUM (ANALYZE, SKIP_LOCKED) {table}"))
                except Exception as exc:
                    await autocommit.rollback()
                    logger.warning(
                        "vacuum after erasure failed: %s (%s)", table, type(exc).__name__
                    )
    except Exception as exc:
        logger.warning("vacuum after erasure skipped: no connection (%s)", type(exc).__name__)
    finally:
        await engine.dispose()
