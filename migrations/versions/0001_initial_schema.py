"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 13:58:30.891806
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_tenants")),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("secret_sha256", sa.String(length=64), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_api_keys_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
    )
    op.create_index(op.f("ix_api_keys_tenant"), "api_keys", ["tenant"], unique=False)
    op.create_table(
        "document_versions",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("document_id", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("uri", sa.Text(), nullable=True),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("chunk_count", sa.Integer(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("erasure_id", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_document_versions_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint(
            "tenant", "document_id", "version", name=op.f("pk_document_versions")
        ),
    )
    op.create_index(
        op.f("ix_document_versions_tenant_document_id_seq"),
        "document_versions",
        ["tenant", "document_id", "seq"],
        unique=False,
    )
    op.create_table(
        "erasures",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("erasure_id", sa.Text(), nullable=False),
        sa.Column("document_id", sa.Text(), nullable=False),
        sa.Column("versions", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("request_ref", sa.Text(), nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_erasures_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant", "erasure_id", name=op.f("pk_erasures")),
    )
    op.create_index(
        op.f("ix_erasures_tenant_document_id"), "erasures", ["tenant", "document_id"], unique=False
    )
    op.create_table(
        "memory_records",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("memory_id", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("citation_ids", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("verification_id", sa.Text(), nullable=True),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_memory_records_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant", "memory_id", name=op.f("pk_memory_records")),
    )
    op.create_table(
        "runs",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("query", sa.Text(), nullable=True),
        sa.Column("scope", sa.Text(), nullable=True),
        sa.Column("retrieved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("citation_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"], name=op.f("fk_runs_tenant_tenants")),
        sa.PrimaryKeyConstraint("tenant", "run_id", name=op.f("pk_runs")),
    )
    op.create_index(
        op.f("ix_runs_tenant_retrieved_at"), "runs", ["tenant", "retrieved_at"], unique=False
    )
    op.create_table(
        "chunks",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("document_id", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("chunk_id", sa.Text(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("span_start", sa.Integer(), nullable=False),
        sa.Column("span_end", sa.Integer(), nullable=False),
        sa.Column("utf8_start", sa.Integer(), nullable=False),
        sa.Column("utf8_end", sa.Integer(), nullable=False),
        sa.Column("utf16_start", sa.Integer(), nullable=False),
        sa.Column("utf16_end", sa.Integer(), nullable=False),
        sa.Column("page", sa.Integer(), nullable=True),
        sa.Column("section", sa.Text(), nullable=True),
        sa.Column("uri", sa.Text(), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("span_sha256", sa.String(length=64), nullable=True),
        sa.Column("span_hmac", sa.String(length=64), nullable=False),
        sa.CheckConstraint(
            "span_start >= 0 AND span_end > span_start", name=op.f("ck_chunks_span_ordered")
        ),
        sa.ForeignKeyConstraint(
            ["tenant", "document_id", "version"],
            [
                "document_versions.tenant",
                "document_versions.document_id",
                "document_versions.version",
            ],
            name=op.f("fk_chunks_tenant_document_id_version_document_versions"),
        ),
        sa.PrimaryKeyConstraint(
            "tenant", "document_id", "version", "chunk_id", name=op.f("pk_chunks")
        ),
    )
    op.create_table(
        "citations",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("citation_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("document_id", sa.Text(), nullable=False),
        sa.Column("document_version", sa.Text(), nullable=False),
        sa.Column("chunk_id", sa.Text(), nullable=False),
        sa.Column("span_start", sa.Integer(), nullable=False),
        sa.Column("span_end", sa.Integer(), nullable=False),
        sa.Column("utf8_start", sa.Integer(), nullable=False),
        sa.Column("utf8_end", sa.Integer(), nullable=False),
        sa.Column("utf16_start", sa.Integer(), nullable=False),
        sa.Column("utf16_end", sa.Integer(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("branches", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("retrieved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("uri", sa.Text(), nullable=True),
        sa.Column("page", sa.Integer(), nullable=True),
        sa.Column("section", sa.Text(), nullable=True),
        sa.Column("span_sha256", sa.String(length=64), nullable=True),
        sa.Column("span_hmac", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant", "run_id"],
            ["runs.tenant", "runs.run_id"],
            name=op.f("fk_citations_tenant_run_id_runs"),
        ),
        sa.PrimaryKeyConstraint("tenant", "citation_id", name=op.f("pk_citations")),
    )
    op.create_index(
        op.f("ix_citations_tenant_document_id_document_version"),
        "citations",
        ["tenant", "document_id", "document_version"],
        unique=False,
    )
    op.create_index(
        op.f("ix_citations_tenant_run_id_ordinal"),
        "citations",
        ["tenant", "run_id", "ordinal"],
        unique=False,
    )
    op.create_table(
        "verifications",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("verification_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("code", sa.Text(), nullable=True),
        sa.Column("violations", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("claims", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("provenance", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("claim_count", sa.Integer(), nullable=False),
        sa.Column("citation_count", sa.Integer(), nullable=False),
        sa.Column("answer_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant", "run_id"],
            ["runs.tenant", "runs.run_id"],
            name=op.f("fk_verifications_tenant_run_id_runs"),
        ),
        sa.PrimaryKeyConstraint("tenant", "verification_id", name=op.f("pk_verifications")),
    )
    op.create_index(
        op.f("ix_verifications_tenant_created_at"),
        "verifications",
        ["tenant", "created_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_verifications_tenant_run_id"), "verifications", ["tenant", "run_id"], unique=False
    )
    op.create_table(
        "version_keys",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("document_id", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("hmac_key", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant", "document_id", "version"],
            [
                "document_versions.tenant",
                "document_versions.document_id",
                "document_versions.version",
            ],
            name=op.f("fk_version_keys_tenant_document_id_version_document_versions"),
        ),
        sa.PrimaryKeyConstraint("tenant", "document_id", "version", name=op.f("pk_version_keys")),
    )


def downgrade() -> None:
    op.drop_table("version_keys")
    op.drop_index(op.f("ix_verifications_tenant_run_id"), table_name="verifications")
    op.drop_index(op.f("ix_verifications_tenant_created_at"), table_name="verifications")
    op.drop_table("verifications")
    op.drop_index(op.f("ix_citations_tenant_run_id_ordinal"), table_name="citations")
    op.drop_index(op.f("ix_citations_tenant_document_id_document_version"), table_name="citations")
    op.drop_table("citations")
    op.drop_table("chunks")
    op.drop_index(op.f("ix_runs_tenant_retrieved_at"), table_name="runs")
    op.drop_table("runs")
    op.drop_table("memory_records")
    op.drop_index(op.f("ix_erasures_tenant_document_id"), table_name="erasures")
    op.drop_table("erasures")
    op.drop_index(
        op.f("ix_document_versions_tenant_document_id_seq"), table_name="document_versions"
    )
    op.drop_table("document_versions")
    op.drop_index(op.f("ix_api_keys_tenant"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
