"""The deployment files agree with the app: the image, the compose file, the README, the schema.

Nothing here needs a container engine: the Dockerfile and compose file are read as text and
YAML and checked against what the app reads and serves. The tenant rule for the schema is
checked on the ORM tables and on the migrated database, so neither can drift from it.
"""

from __future__ import annotations

import json
import re
import signal
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from pydantic import AliasChoices
from sqlalchemy import Column, UniqueConstraint, text
from sqlalchemy.ext.asyncio import AsyncConnection

import app.models  # noqa: F401  (registers every table on the metadata)
from app import cli
from app.config import Settings, get_settings
from app.db import Base
from app.main import create_app

ROOT = Path(__file__).parent.parent
# Not partitioned by tenant: a key is looked up before its tenant is known.
GLOBAL_TABLES = {"tenants", "api_keys"}


def _app_variables() -> set[str]:
    """The environment variables the app reads, from the Settings fields."""
    prefix = Settings.model_config.get("env_prefix", "")
    names = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {choice for choice in alias.choices if isinstance(choice, str)}
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(prefix + name)
    return {name.upper() for name in names}


def _final_stage() -> list[tuple[str, str]]:
    """The Dockerfile's last stage as (INSTRUCTION, arguments), continuation lines joined."""
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    instructions = []
    for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def _exec_form(arguments: str) -> list[str]:
    command = json.loads(arguments)
    assert isinstance(command, list), f"not exec form (signals would not reach it): {arguments}"
    return [str(part) for part in command]


def _image_command() -> list[str]:
    stage = _final_stage()
    entrypoint = [_exec_form(a) for keyword, a in stage if keyword == "ENTRYPOINT"]
    command = [_exec_form(a) for keyword, a in stage if keyword == "CMD"]
    return (entrypoint[-1] if entrypoint else []) + (command[-1] if command else [])


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _app_services() -> dict[str, dict[str, Any]]:
    """The compose services that run the app's image (those built from this project)."""
    return {name: spec for name, spec in _compose()["services"].items() if "build" in spec}


def _environment(service: dict[str, Any]) -> dict[str, str]:
    given = service.get("environment") or {}
    if isinstance(given, list):
        return dict(entry.partition("=")[::2] for entry in given)
    return {name: str(value) for name, value in given.items()}


def test_compose_runs_the_database_a_migration_and_the_service() -> None:
    services = _compose()["services"]

    assert {"db", "migrate", "grounding"} <= set(services)
    assert set(_app_services()) == {"migrate", "grounding"}
    db = services["db"]
    assert re.fullmatch(r"postgres:(1[6-9]|[2-9]\d)\b.*", db["image"])
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    [volume] = db["volumes"]
    assert volume.partition(":")[0] in _compose()["volumes"], "the data needs a named volume"


def test_the_service_starts_after_a_healthy_database_and_a_finished_migration() -> None:
    services = _compose()["services"]

    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert services["grounding"]["depends_on"] == {
        "db": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }


def test_compose_commands_are_the_grounding_commands() -> None:
    services = _app_services()

    migrate = services["migrate"]["command"]
    assert migrate[0] == "grounding"
    assert cli.parser().parse_args(migrate[1:]).command == "migrate"
    command = services["grounding"].get("command") or _image_command()
    assert command[0] == "grounding"
    served = cli.parser().parse_args(command[1:])
    assert served.command == "serve"
    published = {str(port).rpartition(":")[2] for port in services["grounding"]["ports"]}
    assert str(served.port) in published


def test_compose_sets_only_variables_the_app_reads() -> None:
    read = _app_variables()

    for name, service in _app_services().items():
        environment = _environment(service)
        assert "DATABASE_URL" in environment, name
        assert set(environment) <= read, f"{name} sets {sorted(set(environment) - read)}"


def test_compose_waits_longer_than_the_shutdown_timeout_before_killing() -> None:
    service = _app_services()["grounding"]
    given = _environment(service).get("GROUNDING_SHUTDOWN_TIMEOUT", "")
    interpolated = re.fullmatch(r"\$\{\w+:-(\d+)\}|(\d+)", given)
    timeout = (
        int(next(group for group in interpolated.groups() if group))
        if interpolated
        else Settings().shutdown_timeout
    )

    grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
    assert grace is not None
    assert int(grace.group(1)) > timeout


def test_the_image_serves_on_all_interfaces_on_the_port_it_exposes() -> None:
    command = _image_command()

    assert command[0] == "grounding"
    served = cli.parser().parse_args(command[1:])
    assert served.command == "serve"
    assert served.host == "0.0.0.0"
    exposed = {
        port.partition("/")[0]
        for keyword, arguments in _final_stage()
        if keyword == "EXPOSE"
        for port in arguments.split()
    }
    assert exposed == {str(served.port)}
    assert served.port == cli.parser().parse_args(["serve"]).port, "README documents the default"


def test_the_image_checks_its_health_on_the_served_port() -> None:
    [healthcheck] = [a for keyword, a in _final_stage() if keyword == "HEALTHCHECK"]
    served = cli.parser().parse_args(_image_command()[1:])

    probe = _exec_form(healthcheck.partition(" CMD ")[2])
    assert probe[:2] == ["python", "-c"], "the image has no curl"
    url = re.search(r"http://[\w.]+:(\d+)(/\w+)", probe[2])
    assert url is not None
    assert int(url.group(1)) == served.port
    paths = {getattr(route, "path", None) for route in create_app(Settings()).routes}
    assert url.group(2) == "/healthz"
    assert "/healthz" in paths


def test_the_image_runs_unprivileged_without_dev_extras() -> None:
    stage = _final_stage()
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")

    users = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert users, "the final stage must name a user"
    assert users[-1].partition(":")[0] not in {"root", "0"}
    assert sum(1 for line in dockerfile.splitlines() if line.startswith("FROM ")) >= 2
    assert "[dev]" not in dockerfile
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert {".git", ".venv", ".grounding"} <= set(ignored)


def test_the_package_ships_every_migration_file() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    included = setuptools["packages"]["find"]["include"]
    package_data: dict[str, list[str]] = setuptools.get("package-data", {})

    files = [
        path
        for path in (ROOT / "migrations").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    assert any(path.name == "script.py.mako" for path in files)
    for path in files:
        relative = path.relative_to(ROOT)
        package = ".".join(relative.parent.parts)
        assert any(fnmatch(package, pattern) for pattern in included), relative
        assert (path.parent / "__init__.py").is_file(), f"{relative.parent} is not a package"
        if path.suffix != ".py":
            declared = [
                (owner, glob)
                for owner, globs in package_data.items()
                for glob in globs
                if owner == "*" or package == owner or package.startswith(owner + ".")
            ]
            assert any(
                fnmatch(str(relative.relative_to(*owner.split("."))), glob)
                if owner != "*"
                else fnmatch(path.name, glob)
                for owner, glob in declared
            ), f"{relative} is not package data"


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")

    undocumented = sorted(name for name in _app_variables() if f"`{name}`" not in readme)
    assert not undocumented


def test_every_setting_has_a_description() -> None:
    assert not [name for name, field in Settings.model_fields.items() if not field.description]


@pytest.mark.parametrize(
    ("workers", "budget", "pool_size", "statements"),
    [(1, 20, 20, 5), (4, 20, 5, 1), (3, 20, 6, 1), (40, 20, 1, 0), (1, 3, 3, 0)],
)
def test_workers_share_the_connection_budget(
    workers: int, budget: int, pool_size: int, statements: int
) -> None:
    settings = Settings(workers=workers, db_max_connections=budget)

    assert settings.pool_size == pool_size
    assert workers * settings.pool_size <= max(budget, workers)
    # A worker's sessions and its one-statement reads split its share, sessions keeping one.
    assert settings.statement_pool_size == statements
    assert settings.session_pool_size + settings.statement_pool_size == pool_size
    assert settings.session_pool_size >= 1


@contextmanager
def _no_database(url: str) -> Iterator[str]:
    yield url


def test_serve_hands_its_worker_count_to_uvicorn_and_to_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: runs.append(kwargs))
    monkeypatch.setattr(cli, "migrate", lambda url, **options: None)
    monkeypatch.setattr(cli, "database", lambda settings: _no_database("postgresql://db/x"))
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/x")
    monkeypatch.setenv("GROUNDING_WORKERS", "3")
    monkeypatch.setenv("GROUNDING_DB_MAX_CONNECTIONS", "12")
    get_settings.cache_clear()
    try:
        cli.main(["serve"])
        assert runs[-1]["workers"] == 3
        assert Settings().pool_size == 4

        cli.main(["serve", "--workers", "6"])
        assert runs[-1]["workers"] == 6
        # The workers' own settings, read from the environment, see the count they run under.
        assert Settings().workers == 6
        assert Settings().pool_size == 2
    finally:
        get_settings.cache_clear()


def _leading_tenant_problems(table_name: str, kind: str, columns: list[str]) -> list[str]:
    if columns[:1] == ["tenant"]:
        return []
    return [f"{table_name}: {kind} ({', '.join(map(str, columns))}) does not lead with tenant"]


def test_the_tenant_leads_every_key_and_index_of_every_tenant_table() -> None:
    tables = [table for table in Base.metadata.sorted_tables if table.name not in GLOBAL_TABLES]
    problems = []

    assert tables
    for table in tables:
        problems += _leading_tenant_problems(
            table.name, "primary key", [column.name for column in table.primary_key.columns]
        )
        for constraint in table.constraints:
            if isinstance(constraint, UniqueConstraint):
                names = [column.name for column in constraint.columns]
                problems += _leading_tenant_problems(table.name, "unique constraint", names)
        for index in table.indexes:
            names = [
                expression.name if isinstance(expression, Column) else str(expression)
                for expression in index.expressions
            ]
            problems += _leading_tenant_problems(table.name, f"index {index.name}", names)
        for foreign_key in table.foreign_key_constraints:
            if foreign_key.referred_table.name in GLOBAL_TABLES:
                continue
            pairs = {element.parent.name: element.column.name for element in foreign_key.elements}
            if pairs.get("tenant") != "tenant":
                problems.append(f"{table.name}: a foreign key to another tenant's rows is possible")
    assert not problems


_LIVE_CONSTRAINTS = text(
    """
    SELECT c.relname AS table_name, con.conname AS name, con.contype::text AS kind,
           r.relname AS referred,
           ARRAY(SELECT a.attname::text
                   FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, position)
                   JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
                  ORDER BY k.position) AS columns,
           ARRAY(SELECT a.attname::text
                   FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, position)
                   JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum
                  ORDER BY k.position) AS referred_columns
      FROM pg_constraint con
      JOIN pg_class c ON c.oid = con.conrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
      LEFT JOIN pg_class r ON r.oid = con.confrelid
     WHERE n.nspname = current_schema() AND con.contype IN ('p', 'u', 'x', 'f')
    """
)

_LIVE_INDEXES = text(
    """
    SELECT c.relname AS table_name, ic.relname AS name, i.indisprimary AS is_primary,
           a.attname::text AS leading_column
      FROM pg_index i
      JOIN pg_class c ON c.oid = i.indrelid
      JOIN pg_class ic ON ic.oid = i.indexrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
      LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
     WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
    """
)


async def test_the_migrated_schema_keeps_the_tenant_leading(connection: AsyncConnection) -> None:
    skipped = GLOBAL_TABLES | {"alembic_version"}
    tenant_tables = {table.name for table in Base.metadata.tables.values()} - GLOBAL_TABLES
    problems = []

    constraints = (await connection.execute(_LIVE_CONSTRAINTS)).mappings().all()
    with_primary_key = {row["table_name"] for row in constraints if row["kind"] == "p"}
    assert tenant_tables <= with_primary_key
    for row in constraints:
        if row["table_name"] in skipped:
            continue
        if row["kind"] != "f":
            problems += _leading_tenant_problems(row["table_name"], row["name"], row["columns"])
        elif row["referred"] not in GLOBAL_TABLES:
            pairs = dict(zip(row["columns"], row["referred_columns"], strict=True))
            if pairs.get("tenant") != "tenant":
                problems.append(f"{row['table_name']}: {row['name']} can cross tenants")
    indexes = (await connection.execute(_LIVE_INDEXES)).mappings().all()
    assert tenant_tables <= {row["table_name"] for row in indexes if row["is_primary"]}
    for row in indexes:
        if row["table_name"] not in skipped:
            problems += _leading_tenant_problems(
                row["table_name"], f"index {row['name']}", [row["leading_column"]]
            )
    assert not problems
