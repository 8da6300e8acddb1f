"""admin reads of the audit trail across tenants

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 14:27:05.072974
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from migrations.rls import grant, isolate, release, revoke

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admin_reads",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("read_id", sa.Text(), nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("route", sa.Text(), nullable=False),
        sa.Column("filters", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("read_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant"], ["tenants.name"], name=op.f("fk_admin_reads_tenant_tenants")
        ),
        sa.PrimaryKeyConstraint("tenant", "read_id", name=op.f("pk_admin_reads")),
    )
    op.create_index(
        op.f("ix_admin_reads_tenant_read_at"), "admin_reads", ["tenant", "read_at"], unique=False
    )
    # Append-only for requests, like the audit log that covers it.
    grant("admin_reads", ["SELECT", "INSERT"])
    isolate("admin_reads")


def downgrade() -> None:
    release("admin_reads")
    revoke("admin_reads")
    op.drop_index(op.f("ix_admin_reads_tenant_read_at"), table_name="admin_reads")
    op.drop_table("admin_reads")
