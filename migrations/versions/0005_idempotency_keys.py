"""idempotency keys: a write's first response, kept per tenant and key

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 18:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from migrations.rls import grant, isolate, release, revoke

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("content_type", sa.Text(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_idempotency_keys_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant", "key", name=op.f("pk_idempotency_keys")),
    )
    op.create_index(
        op.f("ix_idempotency_keys_tenant_created_at"),
        "idempotency_keys",
        ["tenant", "created_at"],
        unique=False,
    )
    # Requests claim a key, keep its response, reclaim it once expired and purge expired ones.
    grant("idempotency_keys", ["SELECT", "INSERT", "UPDATE", "DELETE"])
    isolate("idempotency_keys")
    # Each document a kept response names, so that an erasure of one finds the responses.
    op.create_table(
        "idempotency_documents",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("document_id", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant", "key"],
            ["idempotency_keys.tenant", "idempotency_keys.key"],
            name=op.f("fk_idempotency_documents_tenant_key_idempotency_keys"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant", "document_id", "key", name=op.f("pk_idempotency_documents")
        ),
    )
    op.create_index(
        op.f("ix_idempotency_documents_tenant_key"),
        "idempotency_documents",
        ["tenant", "key"],
        unique=False,
    )
    grant("idempotency_documents", ["SELECT", "INSERT", "DELETE"])
    isolate("idempotency_documents")


def downgrade() -> None:
    release("idempotency_documents")
    revoke("idempotency_documents")
    op.drop_index(op.f("ix_idempotency_documents_tenant_key"), table_name="idempotency_documents")
    op.drop_table("idempotency_documents")
    release("idempotency_keys")
    revoke("idempotency_keys")
    op.drop_index(op.f("ix_idempotency_keys_tenant_created_at"), table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
