"""The `grounding` command: serve, migrate, and bootstrap tenants and keys."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from app.config import Settings, get_settings
from app.db import app_password, create_engine, create_sessionmaker, migrate


@contextmanager
def database(settings: Settings) -> Iterator[str]:
    """`DATABASE_URL` when set; otherwise the embedded PostgreSQL, left when the block ends."""
    if settings.database_url:
        yield settings.database_url
        return
    from app.embedded import embedded_database

    with embedded_database(settings.data_dir) as url:
        yield url


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _serve(args: argparse.Namespace, settings: Settings) -> None:
    import uvicorn

    from app.logs import logging_config

    # uvicorn drains requests on SIGINT/SIGTERM, then re-raises the signal to the handler it
    # found: this one, so that the embedded database below is stopped before the process exits.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, _exit_cleanly)
    workers = settings.workers if args.workers is None else args.workers
    with database(settings) as url:
        migrate(url, app_password=app_password(settings))
        # Workers (and this process's own app factory) read the URL from the environment, and
        # the worker count, which divides the connection budget into their pools.
        os.environ["DATABASE_URL"] = url
        os.environ["GROUNDING_WORKERS"] = str(workers)
        get_settings.cache_clear()
        uvicorn.run(
            "app.main:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=workers,
            timeout_graceful_shutdown=settings.shutdown_timeout,
            log_level="info",
            # One JSON line a record (app.logs), in every worker; the request log is the app's.
            log_config=logging_config(),
            access_log=False,
        )


def _migrate(args: argparse.Namespace, settings: Settings) -> None:
    with database(settings) as url:
        migrate(url, app_password=app_password(settings))
    print("migrations applied")


async def _bootstrap(url: str, settings: Settings, args: argparse.Namespace) -> str:
    from app.access import service as access

    engine = create_engine(settings, url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            if args.command == "tenants":
                tenant, created = await access.create_tenant(session, name=args.name)
                return f"tenant {tenant.name} {'created' if created else 'exists already'}"
            scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
            issued = await access.create_key(session, tenant=args.tenant, scopes=scopes)
            scopes_shown = ", ".join(issued.key.scopes)
            return f"key {issued.key.key_id} for {args.tenant} ({scopes_shown})\n{issued.secret}"
    finally:
        await engine.dispose()


def _bootstrap_command(args: argparse.Namespace, settings: Settings) -> None:
    from app.errors import AppError

    with database(settings) as url:
        migrate(url, app_password=app_password(settings))
        try:
            print(asyncio.run(_bootstrap(url, settings, args)))
        except AppError as error:
            print(f"error: {error.detail}", file=sys.stderr)
            raise SystemExit(2) from None


def openapi_document() -> str:
    """The app's OpenAPI document as YAML, as committed in `openapi.yaml`."""
    import yaml

    from app.main import create_app

    return yaml.safe_dump(create_app(Settings()).openapi(), sort_keys=False, allow_unicode=True)


def _openapi(args: argparse.Namespace, settings: Settings) -> None:
    print(openapi_document(), end="")


def _positive(value: str) -> int:
    number = int(value) if value.isdecimal() else 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return number


def parser() -> argparse.ArgumentParser:
    """The command line, as the README documents it."""
    root = argparse.ArgumentParser(prog="grounding", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="apply migrations, then serve")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--workers", type=_positive, help="worker processes (default: GROUNDING_WORKERS, 1)"
    )
    serve.set_defaults(handler=_serve)
    commands.add_parser("migrate", help="apply migrations and exit").set_defaults(handler=_migrate)
    commands.add_parser("openapi", help="print the OpenAPI document (YAML)").set_defaults(
        handler=_openapi
    )
    tenants = commands.add_parser("tenants", help="manage tenants")
    tenants_commands = tenants.add_subparsers(dest="action", required=True)
    create_tenant = tenants_commands.add_parser("create", help="create a tenant")
    create_tenant.add_argument("name")
    create_tenant.set_defaults(handler=_bootstrap_command)
    keys = commands.add_parser("keys", help="manage API keys")
    keys_commands = keys.add_subparsers(dest="action", required=True)
    create_key = keys_commands.add_parser(
        "create", help="create a key; its secret is the last line printed"
    )
    create_key.add_argument("--tenant", required=True)
    create_key.add_argument("--scopes", required=True, help="comma-separated, e.g. agent,support")
    create_key.set_defaults(handler=_bootstrap_command)
    return root


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `grounding` command."""
    args = parser().parse_args(argv)
    args.handler(args, get_settings())
