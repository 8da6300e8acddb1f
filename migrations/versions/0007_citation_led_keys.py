"""citation-led primary keys for the blast radius tables

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06 03:05:00.000000

`verification_citations` and `memory_citations` are read only by citation (whose verifications
or memories rest on a source), yet each kept two B-trees: a primary key led by the record's id,
which no statement reads, and an index on (tenant, citation_id). With the primary key led by the
citation instead, one B-tree keeps the same uniqueness and serves the same reads, and every
verification writes one index entry per citation it rests on instead of two: about 30 entries in
all for an answer over 20 citations, where it wrote about 50.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each table and the id of the record that rests on a citation.
TABLES = (("verification_citations", "verification_id"), ("memory_citations", "memory_id"))


def _rekey(table: str, columns: list[str]) -> None:
    op.drop_constraint(f"pk_{table}", table, type_="primary")
    op.create_primary_key(f"pk_{table}", table, columns)


def upgrade() -> None:
    for table, record_id in TABLES:
        op.drop_index(f"ix_{table}_tenant_citation_id", table_name=table)
        _rekey(table, ["tenant", "citation_id", record_id])


def downgrade() -> None:
    for table, record_id in TABLES:
        _rekey(table, ["tenant", record_id, "citation_id"])
        op.create_index(f"ix_{table}_tenant_citation_id", table, ["tenant", "citation_id"])
