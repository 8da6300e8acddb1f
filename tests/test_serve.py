"""`grounding serve` as a real process on the embedded default, talked to over a socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _environment(data_dir: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return environment | {"GROUNDING_DATA_DIR": str(data_dir)}


def _grounding(data_dir: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "app", *args],
        env=_environment(data_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def _postgres_processes(data_dir: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and any(str(data_dir) in part for part in cmdline):
            found.append(process)
    return found


def _wait_ready(base_url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "serve exited before it was ready"
        try:
            if httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("serve did not become ready")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    data_dir = tmp_path / "data"
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port)],
        env=_environment(data_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(f"http://127.0.0.1:{port}", process)
        yield f"http://127.0.0.1:{port}", data_dir, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        for leftover in _postgres_processes(data_dir):
            leftover.kill()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_serve_on_embedded_default_answers_and_stops_its_database(
    served: tuple[str, Path, subprocess.Popen[bytes]], stop_signal: signal.Signals
) -> None:
    base_url, data_dir, process = served
    assert _postgres_processes(data_dir), "the embedded PostgreSQL should be running"
    # The CLI joins the running embedded server on the same data directory.
    _grounding(data_dir, "tenants", "create", "acme")
    printed = _grounding(data_dir, "keys", "create", "--tenant", "acme", "--scopes", "ingest,agent")
    secret = printed.strip().splitlines()[-1]
    assert _postgres_processes(data_dir), "a CLI command must not stop serve's database"

    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=10) as client:
        registered = client.post(
            "/v1/documents/d/versions",
            json={
                "version": "v1",
                "text": "héllo 🌍",
                "chunks": [{"chunk_id": "c", "start": 0, "end": 7}],
            },
        )
        assert registered.status_code == 201, registered.text
        run = client.post(
            "/v1/runs",
            json={
                "results": [
                    {"document_id": "d", "version": "v1", "chunk_id": "c", "start": 0, "end": 7}
                ]
            },
        )
        assert run.status_code == 201, run.text
        assert run.json()["citations"][0]["span_utf8"] == {"start": 0, "end": 11}

    process.send_signal(stop_signal)
    assert process.wait(60) == 0
    deadline = time.monotonic() + 10
    while _postgres_processes(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _postgres_processes(data_dir) == [], "serve must stop the embedded PostgreSQL on exit"
