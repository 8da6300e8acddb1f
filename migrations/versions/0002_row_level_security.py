"""row-level security: requests run as a role that owns nothing and sees one tenant

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 14:20:00
"""

from collections.abc import Sequence

from alembic import op

from migrations.rls import APP, AUDITOR, grant, isolate, release, revoke

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What requests may do to each table; every other privilege stays with the owner.
GRANTS = {
    "tenants": ["SELECT", "INSERT"],
    "api_keys": ["SELECT", "INSERT", "UPDATE (revoked_at)"],
    "document_versions": ["SELECT", "INSERT", "UPDATE (text, sha256, erased_at, erasure_id)"],
    "version_keys": ["SELECT", "INSERT", "DELETE"],
    "chunks": ["SELECT", "INSERT", "UPDATE (text, span_sha256)"],
    "runs": ["SELECT", "INSERT"],
    "citations": ["SELECT", "INSERT", "UPDATE (span_sha256)"],
    "verifications": ["SELECT", "INSERT"],
    "memory_records": ["SELECT", "INSERT"],
    "erasures": ["SELECT", "INSERT"],
}

# Tables keyed by tenant. `tenants` and `api_keys` are global: a key is read before its tenant
# is known, and only its hash is stored.
TENANT_TABLES = [t for t in GRANTS if t not in ("tenants", "api_keys")]


def upgrade() -> None:
    for role, attributes in ((APP, "LOGIN NOINHERIT"), (AUDITOR, "NOLOGIN")):
        op.execute(
            f"""
            DO $$ BEGIN
                IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
                    CREATE ROLE {role} {attributes} NOSUPERUSER NOBYPASSRLS;
                END IF;
            END $$
            """
        )
    # The app may become the read-only auditor for admin reads across tenants, explicitly
    # (SET LOCAL ROLE); NOINHERIT keeps it from holding the auditor's reach otherwise.
    op.execute(f"GRANT {AUDITOR} TO {APP}")
    op.execute(f"GRANT USAGE ON SCHEMA public TO {APP}, {AUDITOR}")
    op.execute(f"GRANT SELECT ON alembic_version TO {APP}")
    for table, privileges in GRANTS.items():
        grant(table, privileges)
    op.execute(f"GRANT USAGE ON SEQUENCE document_versions_seq_seq TO {APP}")
    for table in TENANT_TABLES:
        isolate(table)


def downgrade() -> None:
    for table in TENANT_TABLES:
        release(table)
    op.execute(f"REVOKE USAGE ON SEQUENCE document_versions_seq_seq FROM {APP}")
    for table in GRANTS:
        revoke(table)
    op.execute(f"REVOKE SELECT ON alembic_version FROM {APP}")
    op.execute(f"REVOKE USAGE ON SCHEMA public FROM {APP}, {AUDITOR}")
    # The roles are the cluster's, shared by every database migrated on it: they stay.
