"""Row-level security statements the revisions share, so every tenant table gets the same rules."""

from alembic import op

APP = "grounding_app"
AUDITOR = "grounding_auditor"

# An empty setting is no tenant: with none set, a query sees nothing, never everything.
CURRENT_TENANT = "NULLIF(current_setting('app.tenant', true), '')"


def grant(table: str, privileges: list[str]) -> None:
    """Let requests do `privileges` on `table`, and the auditor read it."""
    op.execute(f"GRANT {', '.join(privileges)} ON {table} TO {APP}")
    op.execute(f"GRANT SELECT ON {table} TO {AUDITOR}")


def revoke(table: str) -> None:
    op.execute(f"REVOKE ALL ON {table} FROM {APP}, {AUDITOR}")


def isolate(table: str) -> None:
    """Bind every request to its tenant's rows of `table`; the auditor reads them all."""
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_isolation ON {table} TO {APP}"
        f" USING (tenant = {CURRENT_TENANT}) WITH CHECK (tenant = {CURRENT_TENANT})"
    )
    op.execute(f"CREATE POLICY audit_read ON {table} FOR SELECT TO {AUDITOR} USING (true)")


def release(table: str) -> None:
    op.execute(f"DROP POLICY audit_read ON {table}")
    op.execute(f"DROP POLICY tenant_isolation ON {table}")
    op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
