"""Every ORM table. The tenant leads the primary key of every tenant table.

`tenants` and `api_keys` are the only tables not partitioned by tenant: a key is looked up
before its tenant is known.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base

Timestamp = DateTime(timezone=True)
# Ids, names, codes and arrays of them compare byte by byte. Under the database's collation, a
# locale's as often as not, every B-tree descent and join compares them the locale's slower way,
# to order them no more usefully. Every column holding one has it (migration 0008): columns of
# two collations cannot be compared, and an index of the one would not serve the other.
Identifier = Text(collation="C")


class Tenant(Base):
    """A tenant; its name is the `tenant` on every resource."""

    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(Identifier, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp, server_default=func.now())


class ApiKey(Base):
    """An API key: its secret is kept only as a sha256, compared in constant time."""

    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), index=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Identifier))
    created_at: Mapped[datetime] = mapped_column(Timestamp, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(Timestamp)


class DocumentVersion(Base):
    """An immutable registered version; its text is removed, and a tombstone kept, on erasure."""

    __tablename__ = "document_versions"
    __table_args__ = (Index(None, "tenant", "document_id", "seq"),)

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    document_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    version: Mapped[str] = mapped_column(Identifier, primary_key=True)
    # Registration order, so "registered after" needs no clock comparisons.
    seq: Mapped[int] = mapped_column(BigInteger, Identity())
    text: Mapped[str | None] = mapped_column(Text)
    sha256: Mapped[str | None] = mapped_column(String(64))
    uri: Mapped[str | None] = mapped_column(Text)
    title: Mapped[str | None] = mapped_column(Text)
    chunk_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(Timestamp, server_default=func.now())
    erased_at: Mapped[datetime | None] = mapped_column(Timestamp)
    erasure_id: Mapped[str | None] = mapped_column(Identifier)


class VersionKey(Base):
    """The per-version key of the keyed span hashes; erasure deletes it, so none can be guessed."""

    __tablename__ = "version_keys"
    __table_args__ = (
        ForeignKeyConstraint(
            ["tenant", "document_id", "version"],
            [
                "document_versions.tenant",
                "document_versions.document_id",
                "document_versions.version",
            ],
        ),
    )

    tenant: Mapped[str] = mapped_column(Identifier, primary_key=True)
    document_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    version: Mapped[str] = mapped_column(Identifier, primary_key=True)
    hmac_key: Mapped[bytes] = mapped_column(LargeBinary)


class Chunk(Base):
    """A registered chunk with its offsets in three encodings and its hashes, computed once."""

    __tablename__ = "chunks"
    __table_args__ = (
        ForeignKeyConstraint(
            ["tenant", "document_id", "version"],
            [
                "document_versions.tenant",
                "document_versions.document_id",
                "document_versions.version",
            ],
        ),
        CheckConstraint("span_start >= 0 AND span_end > span_start", name="span_ordered"),
    )

    tenant: Mapped[str] = mapped_column(Identifier, primary_key=True)
    document_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    version: Mapped[str] = mapped_column(Identifier, primary_key=True)
    chunk_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    span_start: Mapped[int] = mapped_column(Integer)
    span_end: Mapped[int] = mapped_column(Integer)
    utf8_start: Mapped[int] = mapped_column(Integer)
    utf8_end: Mapped[int] = mapped_column(Integer)
    utf16_start: Mapped[int] = mapped_column(Integer)
    utf16_end: Mapped[int] = mapped_column(Integer)
    page: Mapped[int | None] = mapped_column(Integer)
    section: Mapped[str | None] = mapped_column(Text)
    uri: Mapped[str | None] = mapped_column(Text)
    # The cited characters themselves, so an excerpt reads one row; null once erased.
    text: Mapped[str | None] = mapped_column(Text)
    span_sha256: Mapped[str | None] = mapped_column(String(64))
    span_hmac: Mapped[str] = mapped_column(String(64))


class Run(Base):
    """A recorded retrieval run."""

    __tablename__ = "runs"
    __table_args__ = (
        Index(None, "tenant", "retrieved_at"),
        Index(None, "tenant", "key_id", "retrieved_at"),
    )

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    run_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    query: Mapped[str | None] = mapped_column(Text)
    scope: Mapped[str | None] = mapped_column(Text)
    retrieved_at: Mapped[datetime] = mapped_column(Timestamp)
    key_id: Mapped[str] = mapped_column(Identifier)
    citation_count: Mapped[int] = mapped_column(Integer)


class CitationRow(Base):
    """A citation as issued; `span_sha256` is nulled when its version is erased."""

    __tablename__ = "citations"
    __table_args__ = (
        ForeignKeyConstraint(["tenant", "run_id"], ["runs.tenant", "runs.run_id"]),
        Index(None, "tenant", "run_id", "ordinal"),
        Index(None, "tenant", "document_id", "document_version"),
    )

    tenant: Mapped[str] = mapped_column(Identifier, primary_key=True)
    citation_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    run_id: Mapped[str] = mapped_column(Identifier)
    ordinal: Mapped[int] = mapped_column(Integer)
    document_id: Mapped[str] = mapped_column(Identifier)
    document_version: Mapped[str] = mapped_column(Identifier)
    chunk_id: Mapped[str] = mapped_column(Identifier)
    span_start: Mapped[int] = mapped_column(Integer)
    span_end: Mapped[int] = mapped_column(Integer)
    utf8_start: Mapped[int] = mapped_column(Integer)
    utf8_end: Mapped[int] = mapped_column(Integer)
    utf16_start: Mapped[int] = mapped_column(Integer)
    utf16_end: Mapped[int] = mapped_column(Integer)
    score: Mapped[float | None] = mapped_column(Float)
    branches: Mapped[dict[str, float]] = mapped_column(JSONB)
    retrieved_at: Mapped[datetime] = mapped_column(Timestamp)
    uri: Mapped[str | None] = mapped_column(Text)
    page: Mapped[int | None] = mapped_column(Integer)
    section: Mapped[str | None] = mapped_column(Text)
    span_sha256: Mapped[str | None] = mapped_column(String(64))
    span_hmac: Mapped[str] = mapped_column(String(64))


class Verification(Base):
    """One check of one answer, pass or fail; claims and citation ids, never citation copies."""

    __tablename__ = "verifications"
    __table_args__ = (
        ForeignKeyConstraint(["tenant", "run_id"], ["runs.tenant", "runs.run_id"]),
        Index(None, "tenant", "run_id"),
        Index(None, "tenant", "created_at"),
        Index(None, "tenant", "outcome", "created_at"),
        Index(None, "tenant", "code", "created_at"),
        Index(None, "tenant", "key_id", "created_at"),
    )

    tenant: Mapped[str] = mapped_column(Identifier, primary_key=True)
    verification_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    run_id: Mapped[str] = mapped_column(Identifier)
    key_id: Mapped[str] = mapped_column(Identifier)
    outcome: Mapped[str] = mapped_column(Identifier)
    code: Mapped[str | None] = mapped_column(Identifier)
    violations: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    claims: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    provenance: Mapped[list[str]] = mapped_column(ARRAY(Identifier))
    claim_count: Mapped[int] = mapped_column(Integer)
    citation_count: Mapped[int] = mapped_column(Integer)
    answer_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(Timestamp)


class MemoryRecord(Base):
    """Text written back to memory, with the citation ids it came from."""

    __tablename__ = "memory_records"
    __table_args__ = (Index(None, "tenant", "created_at"),)

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    memory_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    citation_ids: Mapped[list[str]] = mapped_column(ARRAY(Identifier))
    verification_id: Mapped[str | None] = mapped_column(Identifier)
    key_id: Mapped[str] = mapped_column(Identifier)
    created_at: Mapped[datetime] = mapped_column(Timestamp)


class Erasure(Base):
    """A right-to-erasure request carried out on some versions of one document."""

    __tablename__ = "erasures"
    __table_args__ = (
        Index(None, "tenant", "document_id"),
        Index(None, "tenant", "erased_at"),
        Index(None, "tenant", "key_id", "erased_at"),
    )

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    erasure_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    document_id: Mapped[str] = mapped_column(Identifier)
    versions: Mapped[list[str]] = mapped_column(ARRAY(Identifier))
    reason: Mapped[str] = mapped_column(Text)
    request_ref: Mapped[str] = mapped_column(Text)
    key_id: Mapped[str] = mapped_column(Identifier)
    erased_at: Mapped[datetime] = mapped_column(Timestamp)


class VerificationCitation(Base):
    """A citation id one verification's claims rest on, so a source's blast radius is indexed.

    Read only by citation: the primary key, led by it, is the one index (one entry per row).
    """

    __tablename__ = "verification_citations"

    tenant: Mapped[str] = mapped_column(Identifier, primary_key=True)
    citation_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    verification_id: Mapped[str] = mapped_column(Identifier, primary_key=True)


class MemoryCitation(Base):
    """A citation id a memory record came from; read only by citation, as a verification's."""

    __tablename__ = "memory_citations"

    tenant: Mapped[str] = mapped_column(Identifier, primary_key=True)
    citation_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    memory_id: Mapped[str] = mapped_column(Identifier, primary_key=True)


class AuditEntry(Base):
    """One audit record (run, verification, erasure, admin read) in its tenant's append-only log.

    Writers only insert, so none waits for another; `xid` (the inserting transaction) decides
    which checkpoint seals the entry, and `content_sha256` covers the record as stored, with
    keyed hashes only where content may be erased.
    """

    __tablename__ = "audit_entries"
    __table_args__ = (Index(None, "tenant", "xid"),)

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    xid: Mapped[int] = mapped_column(
        BigInteger, server_default=text("(pg_current_xact_id()::text)::bigint")
    )
    kind: Mapped[str] = mapped_column(Identifier)
    record_id: Mapped[str] = mapped_column(Identifier)
    content_sha256: Mapped[str] = mapped_column(String(64))
    recorded_at: Mapped[datetime] = mapped_column(Timestamp, server_default=func.now())


class AuditCheckpoint(Base):
    """A sealed batch of a tenant's audit entries: their hashes, Merkle root, and chain link."""

    __tablename__ = "audit_checkpoints"

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Seals the entries of transactions from the previous horizon up to (not including) this.
    horizon: Mapped[int] = mapped_column(BigInteger)
    entry_count: Mapped[int] = mapped_column(Integer)
    first_seq: Mapped[int] = mapped_column(BigInteger)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    leaf_hashes: Mapped[bytes] = mapped_column(LargeBinary)
    root: Mapped[str] = mapped_column(String(64))
    previous_hash: Mapped[str] = mapped_column(String(64))
    checkpoint_hash: Mapped[str] = mapped_column(String(64))
    sealed_at: Mapped[datetime] = mapped_column(Timestamp, server_default=func.now())


class AdminRead(Base):
    """An admin key's read of the audit trail across tenants: its route and query parameters."""

    __tablename__ = "admin_reads"
    __table_args__ = (Index(None, "tenant", "read_at"),)

    # The admin key's own tenant, not the tenants it read.
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    read_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    key_id: Mapped[str] = mapped_column(Identifier)
    route: Mapped[str] = mapped_column(Text)
    filters: Mapped[dict[str, Any]] = mapped_column(JSONB)
    read_at: Mapped[datetime] = mapped_column(Timestamp)


class IdempotencyKey(Base):
    """A write's first response under its `Idempotency-Key`, replayed to a retry of it."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index(None, "tenant", "created_at"),)

    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), primary_key=True)
    key: Mapped[str] = mapped_column(Identifier, primary_key=True)
    # sha256 of the method, the path and the body as canonical JSON.
    fingerprint: Mapped[str] = mapped_column(Text)
    # Null only while the claiming transaction has not kept its response (never committed so).
    status: Mapped[int | None] = mapped_column(Integer)
    content_type: Mapped[str | None] = mapped_column(Text)
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(Timestamp)


class IdempotencyDocument(Base):
    """A document a kept response names (in its request or itself): erasing it forgets them."""

    __tablename__ = "idempotency_documents"
    __table_args__ = (
        ForeignKeyConstraint(
            ["tenant", "key"],
            ["idempotency_keys.tenant", "idempotency_keys.key"],
            ondelete="CASCADE",
        ),
        Index(None, "tenant", "key"),
    )

    tenant: Mapped[str] = mapped_column(Identifier, primary_key=True)
    document_id: Mapped[str] = mapped_column(Identifier, primary_key=True)
    key: Mapped[str] = mapped_column(Identifier, primary_key=True)
