"""The service's own work per request, counted in one process: a steady yardstick for revisions.

`bench.run`'s ratios move by up to a quarter between runs on a shared machine, which hides a
change of a few percent. Here the service and the floor app (`bench.floor`) are built in this
process and driven over ASGI, without an HTTP server, `--concurrency` requests at a time,
against a real PostgreSQL. With `--callgrind` the process runs under valgrind's callgrind and
counts instructions only while an operation's measured requests run: repeat runs agree within
half a percent. Without it, the process's CPU time per request is reported, as noisy as the
machine it runs on. Beside either, where the server runs on this machine, its CPU time per
request: what the operation's statements cost PostgreSQL.

Neither counts uvicorn: the figures compare revisions of the service's own work and of its
statements, each beside the floor's; the targets are the benchmark's (`bench.run`). To compare
two revisions, run the same command from each tree (or with `PYTHONPATH` set to it).

    python -m bench.instructions [--callgrind] [--requests 400] [--operations verify runs]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psutil
from sqlalchemy.engine import make_url
from starlette.types import ASGIApp, Message

from bench import floor, payloads
from bench.run import (
    RESOLVE_IDS,
    ROOT,
    database_cpu_seconds,
    database_cpu_since,
    grounding,
    libpq,
    say,
    server_process,
    vacuum,
)
from bench.seed import SEEDED_TABLES, Seeder

# Set by the process that prepared the database for the one it starts under valgrind.
_SECRET_VARIABLE = "BENCH_INSTRUCTIONS_SECRET"
_DOCUMENT = "bench-handbook"
_RUNS = 20
_RESULTS_PER_RUN = 20
_FLOOR_ROWS = 10_000
READ_FLOOR, WRITE_FLOOR = "read floor", "write floor"


@dataclass(frozen=True, slots=True)
class Call:
    """One request as the driver sends it, and the status it must get."""

    method: str
    path: str
    body: bytes | None = None
    expect: int = 200


@dataclass(frozen=True, slots=True)
class Operation:
    """What one measured operation sends, in turn, and the floor it is held against (None: it
    is a floor, sent to the floor app)."""

    name: str
    calls: tuple[Call, ...]
    floor: str | None


@dataclass(frozen=True, slots=True)
class Counted:
    """An operation's requests and what they cost: instructions or CPU seconds in this process,
    and the database server's CPU seconds where it runs on this machine."""

    name: str
    requests: int
    amount: float
    floor: str | None
    database: float | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A scratch database and the tenant and key the operations run as."""

    url: str
    tenant: str
    key_id: str
    secret: str


async def call(app: ASGIApp, request: Call, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """Send `request` to `app` as an HTTP server would, and return the response's body.

    A status other than the one expected stops the measurement: the cost of an error is not
    the cost of the operation.
    """
    body = request.body or b""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    answered = asyncio.Event()
    asked = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    await app(scope, receive, send)
    if status != request.expect:
        raise RuntimeError(
            f"{request.method} {request.path}: expected {request.expect}, got {status}"
        )
    return b"".join(chunks)


async def drive(
    app: ASGIApp,
    calls: Sequence[Call],
    headers: Sequence[tuple[bytes, bytes]],
    *,
    requests: int,
    concurrency: int,
) -> None:
    """Send `requests` of `calls`, taken in turn, `concurrency` at a time."""
    pending = iter(range(requests))
    turn = cycle(calls)

    async def sender() -> None:
        for _ in pending:
            await call(app, next(turn), headers)

    await asyncio.gather(*(sender() for _ in range(concurrency)))


def _posting(path: str, body: Any, expect: int = 200) -> Call:
    return Call("POST", path, orjson.dumps(body), expect)


async def _seed(app: ASGIApp, headers: Sequence[tuple[bytes, bytes]]) -> list[Operation]:
    """A registered version and `_RUNS` runs over its chunks, through the service itself; the
    measured operations over them."""
    register = payloads.register_body()
    register["version"] = "1"
    await call(app, _posting(f"/v1/documents/{_DOCUMENT}/versions", register, 201), headers)
    chunks = [
        payloads.ChunkSpan(_DOCUMENT, "1", c["chunk_id"], c["start"], c["end"])
        for c in register["chunks"]
    ]
    run_calls = tuple(
        _posting(
            "/v1/runs",
            payloads.run_body(chunks[i : i + _RESULTS_PER_RUN]),
            201,
        )
        for i in range(0, len(chunks), _RESULTS_PER_RUN)
    )
    runs = [
        orjson.loads(await call(app, run_calls[i % len(run_calls)], headers)) for i in range(_RUNS)
    ]
    ids = [c["citation_id"] for run in runs for c in run["citations"]]

    def answers(*, reject: bool) -> tuple[Call, ...]:
        return tuple(
            _posting(
                f"/v1/runs/{run['run_id']}/answers",
                payloads.answer_body(run["citations"], reject=reject),
                422 if reject else 200,
            )
            for run in runs
        )

    return [
        Operation(
            "excerpt", tuple(Call("GET", f"/v1/citations/{i}/excerpt") for i in ids), READ_FLOOR
        ),
        Operation(
            "resolve",
            tuple(
                _posting("/v1/citations/resolve", payloads.resolve_body(ids[i : i + RESOLVE_IDS]))
                for i in range(0, len(ids) - RESOLVE_IDS + 1, RESOLVE_IDS)
            ),
            READ_FLOOR,
        ),
        Operation("audit", (Call("GET", "/v1/audit/runs"),), READ_FLOOR),
        Operation("verify", answers(reject=False), WRITE_FLOOR),
        Operation("reject", answers(reject=True), WRITE_FLOOR),
        Operation("runs", run_calls, WRITE_FLOOR),
    ]


def _floors() -> list[Operation]:
    return [
        Operation(
            READ_FLOOR,
            tuple(Call("GET", f"/floor/read/{n}") for n in range(1, _FLOOR_ROWS, 97)),
            None,
        ),
        Operation(
            WRITE_FLOOR,
            tuple(
                _posting("/floor/write", floor.row_body(n), 201) for n in range(1, _FLOOR_ROWS, 97)
            ),
            None,
        ),
    ]


# --- counting --------------------------------------------------------------------------------


class CpuTime:
    """This process's CPU seconds (the app's and the driver's, not PostgreSQL's)."""

    unit = "CPU ms"
    scale = 1e3

    def __init__(self) -> None:
        self._started = 0.0

    def start(self) -> None:
        self._started = time.process_time()

    def stop(self, name: str) -> float:
        return time.process_time() - self._started


# `totals: 123` in a callgrind dump: the instructions counted since the counters were zeroed.
_TOTALS = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)


def callgrind_totals(dump: str) -> int:
    """The instructions a callgrind dump counted."""
    found = _TOTALS.search(dump)
    if found is None:
        raise ValueError("not a callgrind dump: no totals line")
    return int(found[1])


class Callgrind:
    """Instructions, counted by the callgrind this process runs under (`--callgrind-out-file`
    given as `output`): zeroed and switched on for the measured requests only, then dumped."""

    unit = "M instructions"
    scale = 1e-6

    def __init__(self, output: Path) -> None:
        self._output = output
        self._dumps = 0

    def _control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True
        )

    def start(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop(self, name: str) -> float:
        self._control("--instr=off")
        self._control(f"--dump={name}")
        self._dumps += 1
        return callgrind_totals(Path(f"{self._output}.{self._dumps}").read_text())


Counter = CpuTime | Callgrind


async def measure(
    url: str,
    secret: str,
    counter: Counter,
    *,
    names: Sequence[str],
    requests: int,
    warmup: int,
    concurrency: int,
    postmaster: psutil.Process | None = None,
) -> list[Counted]:
    """Build the service and the floor app on the prepared database `url`, seed through the
    service, and count each named operation's `requests` after `warmup` uncounted ones, with
    the CPU time of the database server `postmaster` meanwhile when it is given."""
    from app.config import Settings
    from app.main import create_app

    await floor.prepare(libpq(url), rows=_FLOOR_ROWS)
    service = create_app(Settings(database_url=url))
    floor_app = floor.create_app(libpq(url))
    headers = [
        (b"authorization", f"Bearer {secret}".encode()),
        (b"content-type", b"application/json"),
    ]
    counted = []
    async with (
        service.router.lifespan_context(service),
        floor_app.router.lifespan_context(floor_app),
    ):
        operations = {op.name: op for op in _floors()}
        if set(names) - set(operations):
            operations |= {op.name: op for op in await _seed(service, headers)}
        for name in names:
            operation = operations[name]
            app = floor_app if operation.floor is None else service
            await drive(app, operation.calls, headers, requests=warmup, concurrency=concurrency)
            database_before = database_cpu_seconds(postmaster)
            counter.start()
            await drive(app, operation.calls, headers, requests=requests, concurrency=concurrency)
            amount = counter.stop(name)
            database = database_cpu_since(database_before, database_cpu_seconds(postmaster))
            counted.append(Counted(name, requests, amount, operation.floor, database))
    return counted


def report(counted: Sequence[Counted], unit: str, scale: float) -> list[str]:
    """A table: each operation's cost per request in this process and, where it was read, in
    the database server, each over its floor's where that was counted."""
    own = {c.name: c.amount / c.requests for c in counted}
    database = {c.name: c.database / c.requests for c in counted if c.database is not None}

    def over(costs: dict[str, float], c: Counted) -> str:
        floor_cost = costs.get(c.floor) if c.floor else None
        return f"{costs[c.name] / floor_cost:.2f}" if floor_cost and c.name in costs else ""

    lines = [
        f"{'operation':<14} {'requests':>8} {unit + '/request':>22} {'over floor':>10}"
        f" {'database CPU ms/request':>24} {'over floor':>10}"
    ]
    for c in counted:
        database_ms = f"{database[c.name] * 1e3:.3f}" if c.name in database else "-"
        lines.append(
            f"{c.name:<14} {c.requests:>8} {own[c.name] * scale:>22.3f} {over(own, c):>10}"
            f" {database_ms:>24} {over(database, c):>10}"
        )
    return lines


# --- the database -----------------------------------------------------------------------------


async def _admin(server_url: str, statement: str) -> None:
    connection = await asyncpg.connect(libpq(str(make_url(server_url).set(database="postgres"))))
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@contextmanager
def prepared_database(server_url: str | None, *, rows: int) -> Iterator[Prepared]:
    """A scratch database, migrated, with a tenant, a key of every scope the operations need and
    `rows` chunks and as many citations seeded as the benchmark seeds them (`bench.seed`, which
    needs a superuser), on `server_url` (as its owner) or on an embedded server in a temporary
    directory; dropped (or the server stopped) at the end."""
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as scratch:
        if server_url is None:
            from app.embedded import embedded_database

            with embedded_database(Path(scratch)) as url:
                yield from _scratch_database(url, rows=rows)
        else:
            yield from _scratch_database(server_url, rows=rows)


def _scratch_database(server_url: str, *, rows: int) -> Iterator[Prepared]:
    name = f"bench_instructions_{secrets.token_hex(4)}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    try:
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        environment = {**os.environ, "DATABASE_URL": url}
        grounding(environment, "migrate")
        tenant = f"bench-{secrets.token_hex(3)}"
        grounding(environment, "tenants", "create", tenant)
        scopes = "ingest,agent,support,audit"
        printed = grounding(environment, "keys", "create", "--tenant", tenant, "--scopes", scopes)
        *_, described, secret = printed.strip().splitlines()
        prepared = Prepared(url, tenant, key_id=described.split()[1], secret=secret)
        if rows:
            seeder = Seeder(tenant=tenant, key_id=prepared.key_id)
            asyncio.run(seeder.seed(libpq(url), chunks=rows, citations=rows))
            # Planned as at the benchmark's sizes, not as for empty tables.
            asyncio.run(vacuum(libpq(url), SEEDED_TABLES))
        yield prepared
    finally:
        asyncio.run(_admin(server_url, f'DROP DATABASE "{name}" WITH (FORCE)'))


# --- the command ------------------------------------------------------------------------------

ALL_OPERATIONS = (
    READ_FLOOR,
    "excerpt",
    "resolve",
    "audit",
    WRITE_FLOOR,
    "verify",
    "reject",
    "runs",
)


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    made.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="a server to work on as its owner, in a scratch database (default: DATABASE_URL,"
        " else an embedded PostgreSQL in a temporary directory)",
    )
    made.add_argument("--operations", nargs="+", choices=ALL_OPERATIONS, default=ALL_OPERATIONS)
    made.add_argument(
        "--rows",
        type=int,
        default=10_000,
        help="chunks and citations seeded first, as the benchmark's first size (0: none)",
    )
    made.add_argument("--requests", type=int, default=400, help="counted per operation")
    made.add_argument("--warmup", type=int, default=100, help="sent first, not counted")
    made.add_argument("--concurrency", type=int, default=8)
    made.add_argument(
        "--callgrind", action="store_true", help="count instructions under valgrind's callgrind"
    )
    made.add_argument("--counting-into", type=Path, help=argparse.SUPPRESS)
    return made


def _under_callgrind(args: argparse.Namespace, url: str, secret: str, scratch: Path) -> None:
    output = scratch / "callgrind.out"
    command = [
        "valgrind",
        "--quiet",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={output}",
        # The interpreter itself: a wrapper script would be what valgrind ran instead.
        sys.executable,
        "-m",
        "bench.instructions",
        "--database-url",
        url,
        "--counting-into",
        str(output),
        "--operations",
        *args.operations,
        "--requests",
        str(args.requests),
        "--warmup",
        str(args.warmup),
        "--concurrency",
        str(args.concurrency),
    ]
    done = subprocess.run(
        command,
        env={**os.environ, _SECRET_VARIABLE: secret},
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the count under callgrind failed (exit {done.returncode})")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.counting_into is not None:
        # Started by `_under_callgrind` on the database it prepared.
        counter: Counter = Callgrind(args.counting_into)
        run_measure(args, args.database_url, os.environ[_SECRET_VARIABLE], counter)
        return
    if args.callgrind and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("--callgrind needs valgrind: apt-get install valgrind")
    with prepared_database(args.database_url, rows=args.rows) as prepared:
        if args.callgrind:
            with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as scratch:
                _under_callgrind(args, prepared.url, prepared.secret, Path(scratch))
        else:
            run_measure(args, prepared.url, prepared.secret, CpuTime())


def run_measure(args: argparse.Namespace, url: str, secret: str, counter: Counter) -> None:
    """Measure as `args` say and print the table."""
    counted = asyncio.run(
        measure(
            url,
            secret,
            counter,
            names=args.operations,
            requests=args.requests,
            warmup=args.warmup,
            concurrency=args.concurrency,
            postmaster=server_process(libpq(url)),
        )
    )
    for line in report(counted, counter.unit, counter.scale):
        say(line)


if __name__ == "__main__":
    main()
