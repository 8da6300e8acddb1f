"""row-level security: requests run as a role that owns nothing and sees one tenant

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 14:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP = "grounding_app"
AUDITOR = "grounding_auditor"

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

# An empty setting is no tenant: with none set, a query sees nothing, never everything.
CURRENT_TENANT = "NULLIF(current_setting('app.tenant', true), '')"


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
        op.execute(f"GRANT {', '.join(privileges)} ON {table} TO {APP}")
        op.execute(f"GRANT SELECT ON {table} TO {AUDITOR}")
    op.execute(f"GRANT USAGE ON SEQUENCE document_versions_seq_seq TO {APP}")
    for table in TENANT_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} TO {APP}"
            f" USING (tenant = {CURRENT_TENANT}) WITH CHECK (tenant = {CURRENT_TENANT})"
        )
        op.execute(f"CREATE POLICY audit_read ON {table} FOR SELECT TO {AUDITOR} USING (true)")


def downgrade() -> None:
    for table in TENANT_TABLES:
        op.execute(f"DROP POLICY audit_read ON {table}")
        op.execute(f"DROP POLICY tenant_isolation ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute(f"REVOKE USAGE ON SEQUENCE document_versions_seq_seq FROM {APP}")
    for table in GRANTS:
        op.execute(f"REVOKE ALL ON {table} FROM {APP}, {AUDITOR}")
    op.execute(f"REVOKE SELECT ON alembic_version FROM {APP}")
    op.execute(f"REVOKE USAGE ON SCHEMA public FROM {APP}, {AUDITOR}")
    # The roles are the cluster's, shared by every database migrated on it: they stay.
