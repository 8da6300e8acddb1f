"""audit log and blast radius

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 14:15:34.625758
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.rls import APP, grant, isolate, release, revoke

# Audit entries and checkpoints are append-only for requests: no UPDATE, no DELETE.
GRANTS = {
    "verification_citations": ["SELECT", "INSERT"],
    "memory_citations": ["SELECT", "INSERT"],
    "audit_entries": ["SELECT", "INSERT"],
    "audit_checkpoints": ["SELECT", "INSERT"],
}

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memory_citations",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("memory_id", sa.Text(), nullable=False),
        sa.Column("citation_id", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant", "memory_id", "citation_id", name=op.f("pk_memory_citations")
        ),
    )
    op.create_index(
        op.f("ix_memory_citations_tenant_citation_id"),
        "memory_citations",
        ["tenant", "citation_id"],
        unique=False,
    )
    op.create_table(
        "verification_citations",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("verification_id", sa.Text(), nullable=False),
        sa.Column("citation_id", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant", "verification_id", "citation_id", name=op.f("pk_verification_citations")
        ),
    )
    op.create_index(
        op.f("ix_verification_citations_tenant_citation_id"),
        "verification_citations",
        ["tenant", "citation_id"],
        unique=False,
    )
    op.create_table(
        "audit_checkpoints",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("horizon", sa.BigInteger(), nullable=False),
        sa.Column("entry_count", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("leaf_hashes", sa.LargeBinary(), nullable=False),
        sa.Column("root", sa.String(length=64), nullable=False),
        sa.Column("previous_hash", sa.String(length=64), nullable=False),
        sa.Column("checkpoint_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "sealed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_audit_checkpoints_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant", "number", name=op.f("pk_audit_checkpoints")),
    )
    op.create_table(
        "audit_entries",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            "xid",
            sa.BigInteger(),
            server_default=sa.text("(pg_current_xact_id()::text)::bigint"),
            nullable=False,
        ),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("record_id", sa.Text(), nullable=False),
        sa.Column("content_sha256", sa.String(length=64), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_audit_entries_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant", "seq", name=op.f("pk_audit_entries")),
    )
    op.create_index(
        op.f("ix_audit_entries_tenant_xid"), "audit_entries", ["tenant", "xid"], unique=False
    )
    op.create_index(
        op.f("ix_erasures_tenant_erased_at"), "erasures", ["tenant", "erased_at"], unique=False
    )
    op.create_index(
        op.f("ix_erasures_tenant_key_id_erased_at"),
        "erasures",
        ["tenant", "key_id", "erased_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_memory_records_tenant_created_at"),
        "memory_records",
        ["tenant", "created_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_runs_tenant_key_id_retrieved_at"),
        "runs",
        ["tenant", "key_id", "retrieved_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_verifications_tenant_code_created_at"),
        "verifications",
        ["tenant", "code", "created_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_verifications_tenant_key_id_created_at"),
        "verifications",
        ["tenant", "key_id", "created_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_verifications_tenant_outcome_created_at"),
        "verifications",
        ["tenant", "outcome", "created_at"],
        unique=False,
    )
    op.execute(f"GRANT USAGE ON SEQUENCE audit_entries_seq_seq TO {APP}")
    for table, privileges in GRANTS.items():
        grant(table, privileges)
        isolate(table)


def downgrade() -> None:
    for table in GRANTS:
        release(table)
        revoke(table)
    op.drop_index(op.f("ix_verifications_tenant_outcome_created_at"), table_name="verifications")
    op.drop_index(op.f("ix_verifications_tenant_key_id_created_at"), table_name="verifications")
    op.drop_index(op.f("ix_verifications_tenant_code_created_at"), table_name="verifications")
    op.drop_index(op.f("ix_runs_tenant_key_id_retrieved_at"), table_name="runs")
    op.drop_index(op.f("ix_memory_records_tenant_created_at"), table_name="memory_records")
    op.drop_index(op.f("ix_erasures_tenant_key_id_erased_at"), table_name="erasures")
    op.drop_index(op.f("ix_erasures_tenant_erased_at"), table_name="erasures")
    op.drop_index(op.f("ix_audit_entries_tenant_xid"), table_name="audit_entries")
    op.drop_table("audit_entries")
    op.drop_table("audit_checkpoints")
    op.drop_index(
        op.f("ix_verification_citations_tenant_citation_id"), table_name="verification_citations"
    )
    op.drop_table("verification_citations")
    op.drop_index(op.f("ix_memory_citations_tenant_citation_id"), table_name="memory_citations")
    op.drop_table("memory_citations")
