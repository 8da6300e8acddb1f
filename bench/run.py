"""The benchmark: `python -m bench.run` (or `make bench`); `--help` lists the options.

It starts `grounding serve --workers N` on loopback on a fresh embedded PostgreSQL in a
temporary directory (or on `--database-url`), and beside it the floor app (`bench.floor`) on
the same server with the same worker count. It seeds the database by COPY to each size in
`--scales` (chunks and citations alike), and at each size and worker count loads each
operation with wrk, alternating with its floor (floor, operation, floor, ...), `--repeat`
times. It then checks tail latency at 70% of each operation's rate with a constant-rate open
loop, and loads each floor the same way at 70% of its own rate. Given one and two workers, it
then serves both side by side at each size and loads verification on each in turn. It samples
a worker with py-spy under two loads, and prints every figure, the ratios to the floors, and
each target's pass or fail.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import psutil

from bench import floor, payloads
from bench.load import (
    COUNTER,
    SLOW_OVER_P50,
    Load,
    Measurement,
    constant_rate,
    run_wrk,
    wrk_path,
)
from bench.profile import Profile, hot_spots, py_spy_path, start_recording
from bench.seed import SEEDED_TABLES, Seeder, SeedReport

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
READ, WRITE = "read", "write"
REGISTERED_DOCUMENT = "bench-register"
FLOOR_ROWS = 10_000
SAMPLED_RUNS = 64
SAMPLED_CITATIONS = 2_000
RESOLVE_IDS = 100
RATE_SHARE = 0.7
# Below this, a rise in an open loop's median latency is noise, not a backlog (`OpenLoop`).
BACKLOG_NOISE_MS = 1.0
# An open loop whose p50 is over this share of its closed loop's p50 at the full rate queued
# (`OpenLoop.queued_deeper`). That closed loop's p50 is every connection's request waiting its
# turn; at 70% of its rate, a server that keeps up makes half its requests wait behind half as
# many only a fraction of a percent of the time (0.7 ** 16 in the plainest queue).
# Measured on 2 cores: loops that kept up had p50s at 0.04-0.30 of it, loops behind a queue
# for most of their time at 0.68-0.90.
QUEUED_OVER_FULL_RATE_P50 = 0.5
# The tables seeding fills (`SEEDED_TABLES`) and a block's own writes touch, vacuumed after each.
WRITTEN_TABLES = (*SEEDED_TABLES, "verifications", "verification_citations")

MACHINE_NOTE = (
    "{cpus} CPU(s): wrk (one thread), the service's workers, the floor's workers and PostgreSQL"
    " all share them, with whatever else runs on this machine; on a virtual machine the"
    " hypervisor also takes ('steals') part of their time for other guests, shown as 'stolen'."
    " Absolute figures are noisy; the ratios, measured minutes apart in the same run, are what"
    " counts."
)


@dataclass(frozen=True, slots=True)
class Operation:
    """A measured operation: its load and the floor it is held against."""

    key: str
    label: str
    kind: str
    load: Load


@dataclass
class Pair:
    """One repeat: the floor's measurement, then the operation's, with the CPU seconds their
    workers spent meanwhile, PostgreSQL's (None when the server is not on this machine), and the
    share of the machine's CPU time stolen meanwhile (None where the system does not count it)."""

    floor: Measurement
    operation: Measurement
    floor_cpu: float
    operation_cpu: float
    floor_database_cpu: float | None = None
    operation_database_cpu: float | None = None
    floor_stolen: float | None = None
    operation_stolen: float | None = None

    @property
    def floor_cpu_ms(self) -> float:
        return _per_request_ms(self.floor_cpu, self.floor)

    @property
    def operation_cpu_ms(self) -> float:
        return _per_request_ms(self.operation_cpu, self.operation)

    @property
    def floor_database_cpu_ms(self) -> float | None:
        if self.floor_database_cpu is None:
            return None
        return _per_request_ms(self.floor_database_cpu, self.floor)

    @property
    def operation_database_cpu_ms(self) -> float | None:
        if self.operation_database_cpu is None:
            return None
        return _per_request_ms(self.operation_database_cpu, self.operation)


def _per_request_ms(cpu: float, measured: Measurement) -> float:
    return 1000 * cpu / measured.requests if measured.requests else 0.0


def median_of_known(values: Iterable[float | None]) -> float | None:
    """The median of `values`, or None when any is unknown: no figure is made up."""
    found = list(values)
    if not found or None in found:
        return None
    return statistics.median(cast(list[float], found))


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """One constant-rate loop at `rate` requests per second, and what shared the cores while it
    ran."""

    rate: float
    measured: Measurement
    stolen: float | None = None
    # Autovacuum's work meanwhile (tables it finished, and its workers still at it at the end):
    # it shares the cores with the server.
    autovacuum: int | None = None
    # The share of the loop's time in which some task waited for a core.
    cpu_waited: float | None = None
    # The p50 of the closed loop this loop's rate is a share of, with every connection busy at
    # the server's full rate: the yardstick of `queued_deeper`.
    saturated_p50_ms: float | None = None

    @property
    def tail_ratio(self) -> float | None:
        """p99 over p50, the tail check's figure; None when nothing was answered."""
        measured = self.measured
        return measured.p99_ms / measured.p50_ms if measured.p50_ms else None

    @property
    def backlog_grew(self) -> bool:
        """Whether the server fell behind the arrivals for good: each tenth of the requests
        waited longer than the one before (at the median), and the last over `SLOW_OVER_P50`
        times as long as the first and by more than `BACKLOG_NOISE_MS`. A spell, however long,
        raises a tenth or two and is then caught up; a backlog only grows. The margin keeps a
        median of a fraction of a millisecond that merely doubles from counting as one."""
        tenths = self.measured.tenths_p50_ms
        if not tenths:
            return False
        first, last = tenths[0], tenths[-1]
        rising = all(earlier < later for earlier, later in itertools.pairwise(tenths))
        return rising and last > SLOW_OVER_P50 * first and last - first > BACKLOG_NOISE_MS

    @property
    def queued_deeper(self) -> bool:
        """Whether its p50 is over `QUEUED_OVER_FULL_RATE_P50` of the closed loop's at the full
        rate: half of its requests waited behind half as many as every connection's, in a
        queue the server let grow, for a while or all along, not in the server's tail."""
        saturated = self.saturated_p50_ms
        return (
            saturated is not None and self.measured.p50_ms > QUEUED_OVER_FULL_RATE_P50 * saturated
        )

    @property
    def kept_up(self) -> bool:
        """Whether its rate was served without failures, a growing backlog or a queue over
        half as deep as at the full rate. A loop can answer 95% of its rate and still not keep
        up: 5% short for ten seconds leaves half a second of requests queued at its end, and its
        p50 is then that queue, not the server."""
        measured = self.measured
        return (
            measured.failed == 0
            and measured.rps >= 0.95 * self.rate
            and not self.backlog_grew
            and not self.queued_deeper
        )


@dataclass(frozen=True, slots=True)
class CoresBusy:
    """How many cores a load kept busy on average, by whom: the measured workers, PostgreSQL
    (None when it runs on another machine) and the load generator."""

    workers: float
    database: float | None
    generator: float

    @property
    def total(self) -> float:
        return self.workers + (self.database or 0.0) + self.generator


@dataclass
class OperationResult:
    """An operation's repeats at one size and worker count."""

    key: str
    label: str
    kind: str
    pairs: list[Pair] = field(default_factory=list)
    open_loop: OpenLoop | None = None

    def median(self, pick: Callable[[Pair], float]) -> float:
        return statistics.median(pick(p) for p in self.pairs)

    @property
    def rps(self) -> float:
        return self.median(lambda p: p.operation.rps)

    @property
    def p50(self) -> float:
        return self.median(lambda p: p.operation.p50_ms)

    @property
    def p99(self) -> float:
        return self.median(lambda p: p.operation.p99_ms)

    @property
    def rps_ratio(self) -> float:
        """The median of each repeat's rate over the floor measured just before it."""
        return self.median(lambda p: p.operation.rps / p.floor.rps if p.floor.rps else 0.0)

    @property
    def p50_ratio(self) -> float:
        return self.median(lambda p: p.operation.p50_ms / p.floor.p50_ms if p.floor.p50_ms else 0)

    @property
    def cpu_ms(self) -> float:
        """The workers' CPU per request: steadier than the rate when others share the cores."""
        return self.median(lambda p: p.operation_cpu_ms)

    @property
    def database_cpu_ms(self) -> float | None:
        """PostgreSQL's CPU per request: what the operation's statements cost the server, which
        shares the cores with the workers."""
        return median_of_known(p.operation_database_cpu_ms for p in self.pairs)

    @property
    def stolen(self) -> float | None:
        """The share of the machine's CPU time stolen while the operation was loaded."""
        return median_of_known(p.operation_stolen for p in self.pairs)

    @property
    def cpu_ratio(self) -> float:
        """The floor's CPU per request over the operation's, each repeat's: the rate ratio the
        worker's own work allows, whatever wrk and PostgreSQL take of the cores."""
        return self.median(
            lambda p: p.floor_cpu_ms / p.operation_cpu_ms if p.operation_cpu_ms else 0.0
        )


@dataclass
class Block:
    """Every measurement at one database size and worker count."""

    scale: int
    workers: int
    rows_before: dict[str, int]
    rows_after: dict[str, int] = field(default_factory=dict)
    results: dict[str, OperationResult] = field(default_factory=dict)
    peak_rss_mb: dict[int, float] = field(default_factory=dict)
    floor_peak_rss_mb: dict[int, float] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Each floor's own open loop, at the same share of its own rate: the tail the stack itself
    # shows on this machine, beside the operations' (by kind, read or write).
    floor_open_loops: dict[str, OpenLoop] = field(default_factory=dict)

    def floor_median(self, kind: str, pick: Callable[[Measurement], float]) -> float:
        """The median of `pick` of the floor of `kind` over every repeat held against it."""
        return statistics.median(
            pick(p.floor) for r in self.results.values() if r.kind == kind for p in r.pairs
        )


@dataclass
class WorkerComparison:
    """Verification on a one-worker and a two-worker service side by side on one database,
    loaded alternately (one, two, one, ...): each pair seconds apart. The blocks are minutes
    apart, and a shared machine's speed drifts between them by more than the target's margin."""

    scale: int
    # Each repeat: the one-worker service's load, then the two-worker service's.
    pairs: list[tuple[Timed, Timed]] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Each pair's two-worker rate over its one-worker rate (0 when one served nothing)."""
        return [
            two.measured.rps / one.measured.rps if one.measured.rps else 0.0
            for one, two in self.pairs
        ]

    @property
    def ratio(self) -> float:
        """The median of the pairs' ratios."""
        return statistics.median(self.ratios)

    @property
    def one_worker_busy(self) -> CoresBusy:
        """The cores the one-worker loads kept busy, over all the repeats."""
        ones = [one for one, _ in self.pairs]
        seconds = sum(t.measured.seconds for t in ones)
        database = [t.database_cpu for t in ones]
        return CoresBusy(
            workers=sum(t.cpu for t in ones) / seconds,
            database=None if None in database else sum(cast(list[float], database)) / seconds,
            generator=sum(t.generator_cpu for t in ones) / seconds,
        )


@dataclass(frozen=True, slots=True)
class Credentials:
    """The benchmark's tenant and keys."""

    tenant: str
    secret: str
    key_id: str
    seed_key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


# --- processes -----------------------------------------------------------------------------


def free_port() -> int:
    """A port on loopback nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def grounding_command() -> list[str]:
    """The `grounding` command installed beside this interpreter (else `python -m app`)."""
    beside = Path(sys.executable).parent / "grounding"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "app"]


def grounding(environment: dict[str, str], *args: str) -> str:
    """Run one `grounding` command and return what it printed."""
    done = subprocess.run(
        [*grounding_command(), *args],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"grounding {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


@contextmanager
def serving(
    command: Sequence[str], environment: dict[str, str], ready_url: str, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `command`, wait until `ready_url` answers 200, and stop it (SIGTERM) on exit."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            list(command), env=environment, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise SystemExit(f"{command[0]} exited before it was ready; see {log}")
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{command[0]} did not become ready; see {log}")
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)


def workers_of(process: subprocess.Popen[bytes], count: int) -> list[psutil.Process]:
    """The processes serving requests: uvicorn's spawned workers, or the process itself."""
    parent = psutil.Process(process.pid)
    if count == 1:
        return [parent]
    deadline = time.monotonic() + 30
    while True:
        found = [
            child
            for child in parent.children()
            if any("spawn_main" in part for part in child.cmdline())
        ]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    """The user and system CPU time `processes` have used so far."""
    return sum(sum(process.cpu_times()[:2]) for process in processes)


def server_process(url: str) -> psutil.Process | None:
    """PostgreSQL's postmaster at `url`, when it runs on this machine and can be read."""

    async def postmaster() -> psutil.Process | None:
        connection = await asyncpg.connect(url)
        try:
            # Looked up while the backend lives: it ends with its connection.
            backend = psutil.Process(await connection.fetchval("SELECT pg_backend_pid()"))
            parent = backend.parent()
            if parent is None or "postgres" not in parent.name():
                return None
            parent.cpu_times()
            return parent
        except psutil.Error:
            # Another machine's server (a process here with that pid is not it), or not ours.
            return None
        finally:
            await connection.close()

    return asyncio.run(postmaster())


def database_cpu_seconds(postmaster: psutil.Process | None) -> dict[int, float] | None:
    """The CPU time so far of each of the server's processes (backends come and go)."""
    if postmaster is None:
        return None
    times = {}
    for process in postmaster.children():
        try:
            times[process.pid] = on_cpu_seconds(process)
        except (psutil.Error, OSError):
            continue
    return times


def database_cpu_since(
    before: dict[int, float] | None, after: dict[int, float] | None
) -> float | None:
    """The server's CPU seconds between two readings of `database_cpu_seconds`: all of a process
    that began meanwhile, none of one that ended (the pools keep their backends)."""
    if before is None or after is None:
        return None
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def on_cpu_seconds(process: psutil.Process) -> float:
    """A process's CPU time so far: to the nanosecond where Linux keeps it (`schedstat`, user
    and system time together), else in clock ticks (10 ms), too coarse for a short load."""
    try:
        with open(f"/proc/{process.pid}/schedstat") as stats:
            return int(stats.read().split()[0]) / 1e9
    except FileNotFoundError:
        return float(sum(process.cpu_times()[:2]))


def stolen_share(before: Any, after: Any) -> float | None:
    """The share of the machine's CPU time between two readings of `psutil.cpu_times()` that the
    hypervisor gave to other guests (steal), or None where the system does not count it.

    On a shared virtual machine that is time the processes were ready to run and could not:
    it lowers rates and lengthens tails whatever the code does, and it varies minute to minute.
    """
    if "steal" not in before._fields:
        return None
    # Linux counts a guest's own time inside `user` and `nice` as well.
    counted = [name for name in before._fields if name not in ("guest", "guest_nice")]
    total = sum(getattr(after, name) - getattr(before, name) for name in counted)
    return (after.steal - before.steal) / total if total > 0 else None


CPU_PRESSURE = Path("/proc/pressure/cpu")


def cpu_waited_seconds() -> float | None:
    """The seconds, so far, in which some task of the machine was ready to run and waited for a
    core (Linux's pressure stall information, `some`); None where the system does not count it."""
    try:
        return psi_some_total(CPU_PRESSURE.read_text())
    except (OSError, ValueError):  # no such file, or none this parser knows
        return None


def psi_some_total(pressure: str) -> float:
    """The `some` line's `total` of a pressure file, in seconds (the file counts microseconds)."""
    for line in pressure.splitlines():
        fields = line.split()
        totals = [f.removeprefix("total=") for f in fields if f.startswith("total=")]
        if fields[:1] == ["some"] and totals:
            return int(totals[0]) / 1e6
    raise ValueError("no 'some' line with a total in the pressure file")


def waited_share(before: float | None, after: float | None, seconds: float) -> float | None:
    """The share of `seconds` in which some task waited for a core, from two readings."""
    if before is None or after is None or seconds <= 0:
        return None
    return (after - before) / seconds


@dataclass(frozen=True, slots=True)
class Timed:
    """A wrk measurement, with the CPU seconds the measured processes, the database server and
    wrk itself spent while it ran, and the share of the machine's time stolen meanwhile (a
    dataclass, so that `--json` names its fields)."""

    measured: Measurement
    cpu: float
    database_cpu: float | None
    stolen: float | None
    generator_cpu: float


def timed_load(
    processes: Sequence[psutil.Process],
    postmaster: psutil.Process | None,
    base_url: str,
    load: Load,
    *,
    seconds: float,
    connections: int,
) -> Timed:
    """A wrk measurement, and what `processes`, the database server (a backend that ended
    meanwhile is missed: the pools keep theirs) and the machine's neighbours took while it ran."""
    before, database_before = cpu_seconds(processes), database_cpu_seconds(postmaster)
    machine_before, children_before = psutil.cpu_times(), os.times()
    measured = run_wrk(base_url, load, seconds=seconds, connections=connections)
    # wrk is the only child process waited for meanwhile: the children's times are its own.
    children = os.times()
    generator = sum(children[2:4]) - sum(children_before[2:4])
    stolen = stolen_share(machine_before, psutil.cpu_times())
    spent = cpu_seconds(processes) - before
    database_spent = database_cpu_since(database_before, database_cpu_seconds(postmaster))
    return Timed(measured, spent, database_spent, stolen, generator)


def settle(
    processes: Sequence[psutil.Process],
    *,
    busy_share: float = 10.0,
    interval: float = 0.2,
    limit: float = 30.0,
) -> None:
    """Wait until every process in `processes` is idle (under `busy_share` percent of a core over
    `interval` seconds), at most `limit` seconds: what a load left queued (up to a request per
    connection, a second or more of registrations) is served before the next load is timed."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for process in processes:
            process.cpu_percent(None)
        time.sleep(interval)
        if all(process.cpu_percent(None) < busy_share for process in processes):
            return


def quiesce(url: str, processes: Sequence[psutil.Process]) -> None:
    """Vacuum what the loads so far wrote, then `settle`: before every timed load.

    The registrations alone write hundreds of MB. Left to autovacuum, that is taken up on its
    own schedule, inside whichever load comes next, and counted as that load's (an excerpt's
    p50 went from 0.9 ms to 40 ms while it ran in an open loop).
    """
    asyncio.run(vacuum(libpq(url), (*WRITTEN_TABLES, floor.TABLE)))
    settle(processes)


class MemoryWatch:
    """Samples the resident set size of some processes until stopped, keeping each one's peak."""

    def __init__(self, processes: Sequence[psutil.Process], *, interval: float = 0.2) -> None:
        self._processes = list(processes)
        self._interval = interval
        self._stop = threading.Event()
        self.peaks: dict[int, float] = {p.pid: 0.0 for p in self._processes}
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for process in self._processes:
                try:
                    rss = process.memory_info().rss / 2**20
                except psutil.Error:
                    continue
                self.peaks[process.pid] = max(self.peaks[process.pid], rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- database ------------------------------------------------------------------------------


@contextmanager
def database(args: argparse.Namespace, scratch: Path) -> Iterator[str]:
    """The owner's URL: `--database-url`, or a fresh embedded PostgreSQL under `scratch`."""
    if args.database_url:
        yield args.database_url
        return
    from app.embedded import embedded_database

    with embedded_database(scratch / "data") as url:
        asyncio.run(_configure_server(url))
    # Started again, as `shared_buffers` takes effect only when the server starts.
    with embedded_database(scratch / "data") as url:
        yield url


# A tuned server's settings, the same for the floor and the service, which share the server.
# Seeding writes a few GB of WAL: with the default max_wal_size (1 GB) that forces several
# checkpoints, each followed by full-page images of every page touched again. The default
# shared_buffers (128 MB) holds a tenth of what the reads at 1,000,000 rows touch, so nearly
# every one of them would copy its pages from the kernel's cache; 2 GB holds it all.
SERVER_SETTINGS = {"max_wal_size": "16GB", "checkpoint_timeout": "30min", "shared_buffers": "2GB"}


async def _configure_server(url: str) -> None:
    connection = await asyncpg.connect(libpq(url))
    try:
        for name, value in SERVER_SETTINGS.items():
            await connection.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    finally:
        await connection.close()


def libpq(url: str) -> str:
    """`url` as asyncpg takes it (no SQLAlchemy driver name)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def row_counts(url: str) -> dict[str, int]:
    """Rows in the seeded tables and the verifications, over every tenant."""
    connection = await asyncpg.connect(url)
    try:
        return {
            table: int(await connection.fetchval(f"SELECT count(*) FROM {table}"))
            for table in ("document_versions", "chunks", "runs", "citations", "verifications")
        }
    finally:
        await connection.close()


async def vacuum(url: str, tables: Sequence[str]) -> float:
    """VACUUM (ANALYZE) `tables` as the owner; the seconds it took."""
    connection = await asyncpg.connect(url)
    started = time.perf_counter()
    try:
        for table in tables:
            await connection.execute(f"VACUUM (ANALYZE) {table}")
    finally:
        await connection.close()
    return time.perf_counter() - started


async def autovacuum_state(url: str) -> tuple[int, int]:
    """How many times autovacuum has vacuumed or analyzed a table of the database so far, and
    how many of its workers are at it now."""
    connection = await asyncpg.connect(url)
    try:
        done = await connection.fetchval(
            "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_all_tables"
        )
        running = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
        )
        return int(done), int(running)
    finally:
        await connection.close()


async def audit_mark(url: str, tenant: str) -> int:
    """The last audit entry's number for `tenant`: entries after it are a block's own."""
    connection = await asyncpg.connect(url)
    try:
        return int(
            await connection.fetchval(
                "SELECT coalesce(max(seq), 0) FROM audit_entries WHERE tenant = $1", tenant
            )
        )
    finally:
        await connection.close()


async def forget_block_writes(url: str, credentials: Credentials, mark: int) -> None:
    """Delete what one block's load wrote, and vacuum it away, so every block starts at its
    nominal size."""
    tenant, key_id = credentials.tenant, credentials.key_id
    connection = await asyncpg.connect(url)
    try:
        async with connection.transaction():
            await connection.execute(
                "DELETE FROM verification_citations vc USING verifications v"
                " WHERE vc.tenant = $1 AND v.tenant = $1"
                " AND vc.verification_id = v.verification_id AND v.key_id = $2",
                tenant,
                key_id,
            )
            await connection.execute(
                "DELETE FROM verifications WHERE tenant = $1 AND key_id = $2", tenant, key_id
            )
            await connection.execute(
                "DELETE FROM citations c USING runs r WHERE c.tenant = $1 AND r.tenant = $1"
                " AND c.run_id = r.run_id AND r.key_id = $2",
                tenant,
                key_id,
            )
            await connection.execute(
                "DELETE FROM runs WHERE tenant = $1 AND key_id = $2", tenant, key_id
            )
            await connection.execute(
                "DELETE FROM audit_entries WHERE tenant = $1 AND seq > $2", tenant, mark
            )
            for table in ("chunks", "version_keys", "document_versions"):
                await connection.execute(
                    f"DELETE FROM {table} WHERE tenant = $1 AND document_id = $2",
                    tenant,
                    REGISTERED_DOCUMENT,
                )
    finally:
        await connection.close()
    await vacuum(url, WRITTEN_TABLES)


@dataclass(frozen=True, slots=True)
class Sample:
    """Seeded rows the operations are built from, drawn at random at one size."""

    citation_ids: list[str]
    run_ids: list[str]
    chunks: list[payloads.ChunkSpan]


async def sample(url: str, credentials: Credentials, rng: random.Random) -> Sample:
    """Random seeded citations, runs and chunks of the benchmark's tenant."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(f"SELECT setseed({rng.random():.6f})")
        citation_ids = await connection.fetch(
            "SELECT citation_id FROM citations WHERE tenant = $1 ORDER BY random() LIMIT $2",
            credentials.tenant,
            SAMPLED_CITATIONS,
        )
        run_ids = await connection.fetch(
            "SELECT run_id FROM runs WHERE tenant = $1 AND key_id = $2 ORDER BY random() LIMIT $3",
            credentials.tenant,
            credentials.seed_key_id,
            SAMPLED_RUNS,
        )
        chunks = await connection.fetch(
            "SELECT document_id, version, chunk_id, span_start, span_end FROM chunks"
            " WHERE tenant = $1 AND document_id <> $2 ORDER BY random() LIMIT $3",
            credentials.tenant,
            REGISTERED_DOCUMENT,
            SAMPLED_RUNS * 20,
        )
    finally:
        await connection.close()
    return Sample(
        citation_ids=[r["citation_id"] for r in citation_ids],
        run_ids=[r["run_id"] for r in run_ids],
        chunks=[
            payloads.ChunkSpan(
                document_id=r["document_id"],
                version=r["version"],
                chunk_id=r["chunk_id"],
                start=r["span_start"],
                end=r["span_end"],
            )
            for r in chunks
        ],
    )


# --- operations ----------------------------------------------------------------------------


def _json(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def operations(
    base_url: str, credentials: Credentials, drawn: Sample, *, tag: str
) -> tuple[list[Operation], list[str]]:
    """The measured operations over `drawn`, and notes on any left out."""
    auth = credentials.headers
    posting = {**auth, "Content-Type": "application/json"}
    with httpx.Client(base_url=base_url, headers=auth, timeout=60) as client:
        runs = [
            client.get(f"/v1/runs/{run_id}").raise_for_status().json() for run_id in drawn.run_ids
        ]
        paths = set(client.get("/openapi.json").raise_for_status().json()["paths"])

    def answers(reject: bool) -> tuple[tuple[str, str | None], ...]:
        return tuple(
            (
                f"/v1/runs/{run['run_id']}/answers",
                _json(payloads.answer_body(run["citations"], reject=reject)),
            )
            for run in runs
        )

    ids = drawn.citation_ids
    register = payloads.register_body()
    register["version"] = COUNTER
    made = [
        Operation(
            "excerpt",
            "GET /v1/citations/{id}/excerpt",
            READ,
            Load("GET", tuple((f"/v1/citations/{i}/excerpt", None) for i in ids), auth),
        ),
        Operation(
            "resolve",
            "POST /v1/citations/resolve (100 ids)",
            READ,
            Load(
                "POST",
                tuple(
                    (
                        "/v1/citations/resolve",
                        _json(payloads.resolve_body(ids[i : i + RESOLVE_IDS])),
                    )
                    for i in range(0, len(ids) - RESOLVE_IDS + 1, RESOLVE_IDS)
                ),
                posting,
            ),
        ),
    ]
    notes = []
    if "/v1/audit/runs" in paths:
        made.append(
            Operation(
                "audit",
                "GET /v1/audit/runs (a page)",
                READ,
                Load("GET", (("/v1/audit/runs", None),), auth),
            )
        )
    else:
        notes.append("GET /v1/audit/runs is not served yet: the audit page was skipped")
    made += [
        Operation(
            "verify",
            "POST /v1/runs/{id}/answers grounded (10 claims, 20 citations)",
            WRITE,
            Load("POST", answers(reject=False), posting),
        ),
        Operation(
            "reject",
            "POST /v1/runs/{id}/answers rejected (ungrounded_citation)",
            WRITE,
            Load("POST", answers(reject=True), posting, expect=422),
        ),
        Operation(
            "runs",
            "POST /v1/runs (20 results)",
            WRITE,
            Load(
                "POST",
                tuple(
                    ("/v1/runs", _json(payloads.run_body(drawn.chunks[i : i + 20])))
                    for i in range(0, len(drawn.chunks) - 19, 20)
                ),
                posting,
                expect=201,
            ),
        ),
        Operation(
            "register",
            "POST /v1/documents/{id}/versions (200 KB, 200 chunks)",
            WRITE,
            Load(
                "POST",
                ((f"/v1/documents/{REGISTERED_DOCUMENT}/versions", _json(register)),),
                posting,
                expect=201,
                tag=tag,
            ),
        ),
    ]
    return made, notes


def floors(rng: random.Random) -> dict[str, Load]:
    """The read floor (ids in rotation) and the write floor (bodies naming rows to read)."""
    posting = {"Content-Type": "application/json"}
    return {
        READ: Load(
            "GET",
            tuple(
                (f"/floor/read/{rng.randint(1, FLOOR_ROWS)}", None)
                for _ in range(SAMPLED_CITATIONS)
            ),
        ),
        WRITE: Load(
            "POST",
            tuple(
                ("/floor/write", _json(floor.row_body(rng.randint(1, FLOOR_ROWS))))
                for _ in range(SAMPLED_RUNS)
            ),
            posting,
            expect=201,
        ),
    }


def preflight(base_url: str, load: Load, label: str) -> None:
    """Send `load`'s first request once: a wrong status stops the run before any figure."""
    path, body = load.requests[0]
    content = None if body is None else body.replace(COUNTER, f"preflight-{secrets.token_hex(4)}")
    response = httpx.request(
        load.method, base_url + path, headers=dict(load.headers), content=content, timeout=60
    )
    if response.status_code != load.expect:
        raise SystemExit(
            f"{label}: expected {load.expect}, got {response.status_code}: {response.text[:500]}"
        )


# --- one block -----------------------------------------------------------------------------


def service_environment(url: str, scratch: Path) -> dict[str, str]:
    """The environment `grounding serve` runs in: this one, on the benchmark's database."""
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return environment | {"DATABASE_URL": url, "GROUNDING_DATA_DIR": str(scratch / "unused")}


def serving_service(
    port: int, workers: int, environment: dict[str, str], log: Path
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """`grounding serve` on loopback at `port` with `workers` workers, once it is ready."""
    command = [
        *grounding_command(),
        *("serve", "--host", HOST, "--port", str(port), "--workers", str(workers)),
    ]
    return serving(command, environment, f"http://{HOST}:{port}/readyz", log)


def open_loop(
    args: argparse.Namespace,
    url: str,
    port: int,
    load: Load,
    *,
    rate: float,
    saturated_p50_ms: float,
    quiet: Sequence[psutil.Process],
    label: str,
) -> OpenLoop:
    """Send `load` to `port` at `rate` in a constant-rate open loop, once the machine is quiet,
    and note what else took the cores meanwhile."""
    quiesce(url, quiet)
    machine_before = psutil.cpu_times()
    autovacuumed_before, _ = asyncio.run(autovacuum_state(libpq(url)))
    waited_before, started = cpu_waited_seconds(), time.monotonic()
    measured = asyncio.run(
        constant_rate(
            HOST, port, load, rate=rate, seconds=args.duration, connections=args.connections
        )
    )
    waited = waited_share(waited_before, cpu_waited_seconds(), time.monotonic() - started)
    stolen = stolen_share(machine_before, psutil.cpu_times())
    autovacuumed, autovacuuming = asyncio.run(autovacuum_state(libpq(url)))
    say(
        f"  open loop {label:<11} at {rate:7.1f} req/s:"
        f" p50 {measured.p50_ms:7.2f} ms p99 {measured.p99_ms:7.2f} ms"
        f" ({measured.requests} requests, {measured.failed} failed;"
        f" stolen {_share(stolen)})"
    )
    return OpenLoop(
        rate=rate,
        measured=measured,
        stolen=stolen,
        autovacuum=autovacuumed - autovacuumed_before + autovacuuming,
        cpu_waited=waited,
        saturated_p50_ms=saturated_p50_ms,
    )


def measure_block(
    args: argparse.Namespace,
    *,
    url: str,
    scratch: Path,
    credentials: Credentials,
    scale: int,
    workers: int,
    profile: bool,
    rng: random.Random,
) -> Block:
    """Serve the service and the floor with `workers` workers and measure every operation."""
    from app.config import Settings

    block = Block(scale=scale, workers=workers, rows_before=asyncio.run(row_counts(url)))
    asyncio.run(floor.prepare(libpq(url), rows=FLOOR_ROWS))
    environment = service_environment(url, scratch)
    service_port, floor_port = free_port(), free_port()
    service_url, floor_url = f"http://{HOST}:{service_port}", f"http://{HOST}:{floor_port}"
    pool_size = Settings(workers=workers).pool_size
    floor_command = [
        sys.executable,
        "-m",
        "bench.floor",
        "--host",
        HOST,
        "--port",
        str(floor_port),
        "--workers",
        str(workers),
        "--pool-size",
        str(pool_size),
    ]
    floor_environment = environment | {floor.URL_VARIABLE: libpq(url)}
    log = (args.artifacts or scratch) / f"serve-{scale}-{workers}.log"
    with (
        serving_service(service_port, workers, environment, log) as service,
        serving(floor_command, floor_environment, f"{floor_url}/floor/read/1", log) as floor_app,
    ):
        drawn = asyncio.run(sample(url, credentials, rng))
        tag = f"s{scale}-w{workers}-{secrets.token_hex(3)}"
        measured, block.notes = operations(service_url, credentials, drawn, tag=tag)
        if args.ops:
            measured = [operation for operation in measured if operation.key in args.ops]
        floor_loads = floors(rng)
        for kind, load in floor_loads.items():
            preflight(floor_url, load, f"floor {kind}")
        for operation in measured:
            preflight(service_url, operation.load, operation.label)
        service_workers = workers_of(service, workers)
        floor_workers = workers_of(floor_app, workers)
        postmaster = server_process(libpq(url))
        with MemoryWatch(service_workers) as memory, MemoryWatch(floor_workers) as floor_memory:
            say(f"  warming up ({args.warmup:g} s each)")
            for load in floor_loads.values():
                run_wrk(floor_url, load, seconds=args.warmup, connections=args.connections)
            for operation in measured:
                run_wrk(
                    service_url, operation.load, seconds=args.warmup, connections=args.connections
                )
            quiet = [*service_workers, *floor_workers]
            for repeat in range(args.repeat):
                for operation in measured:
                    result = block.results.setdefault(
                        operation.key,
                        OperationResult(operation.key, operation.label, operation.kind),
                    )
                    floor_load = floor_loads[operation.kind]
                    quiesce(url, quiet)
                    on_floor = timed_load(
                        floor_workers,
                        postmaster,
                        floor_url,
                        floor_load,
                        seconds=args.duration,
                        connections=args.connections,
                    )
                    quiesce(url, quiet)
                    on_service = timed_load(
                        service_workers,
                        postmaster,
                        service_url,
                        operation.load,
                        seconds=args.duration,
                        connections=args.connections,
                    )
                    pair = Pair(
                        on_floor.measured,
                        on_service.measured,
                        on_floor.cpu,
                        on_service.cpu,
                        on_floor.database_cpu,
                        on_service.database_cpu,
                        on_floor.stolen,
                        on_service.stolen,
                    )
                    result.pairs.append(pair)
                    say(
                        f"  [{repeat + 1}/{args.repeat}] {operation.key:<9}"
                        f" {pair.operation.rps:8.1f} req/s p50 {pair.operation.p50_ms:7.2f} ms"
                        f" {pair.operation_cpu_ms:6.2f} ms CPU"
                        f" (DB {_ms(pair.operation_database_cpu_ms)})"
                        f" | floor {pair.floor.rps:8.1f} req/s p50 {pair.floor.p50_ms:6.2f} ms"
                        f" {pair.floor_cpu_ms:5.2f} ms CPU (DB {_ms(pair.floor_database_cpu_ms)})"
                        f" | stolen {_share(pair.operation_stolen)}, {_share(pair.floor_stolen)}"
                        + _problems(("floor", pair.floor), ("operation", pair.operation))
                    )
            if not args.no_rate_check:
                for operation in measured:
                    kind = operation.kind
                    if kind not in block.floor_open_loops:
                        block.floor_open_loops[kind] = open_loop(
                            args,
                            url,
                            floor_port,
                            floor_loads[kind],
                            rate=RATE_SHARE * block.floor_median(kind, lambda m: m.rps),
                            saturated_p50_ms=block.floor_median(kind, lambda m: m.p50_ms),
                            quiet=quiet,
                            label=f"floor {kind}",
                        )
                    result = block.results[operation.key]
                    result.open_loop = open_loop(
                        args,
                        url,
                        service_port,
                        operation.load,
                        rate=RATE_SHARE * result.rps,
                        saturated_p50_ms=result.p50,
                        quiet=quiet,
                        label=operation.key,
                    )
            if profile:
                block.profiles = profile_worker(
                    args, service_url, service_workers[0].pid, measured, scratch
                )
        block.peak_rss_mb = memory.peaks
        block.floor_peak_rss_mb = floor_memory.peaks
    block.rows_after = asyncio.run(row_counts(url))
    return block


def compare_workers(
    args: argparse.Namespace,
    *,
    url: str,
    scratch: Path,
    credentials: Credentials,
    scale: int,
    rng: random.Random,
) -> WorkerComparison:
    """Serve a one-worker and a two-worker service side by side and load verification on each
    in turn, `--repeat` times. The one not loaded is idle meanwhile."""
    comparison = WorkerComparison(scale=scale)
    environment = service_environment(url, scratch)
    ports = {count: free_port() for count in (1, 2)}
    urls = {count: f"http://{HOST}:{port}" for count, port in ports.items()}
    log = (args.artifacts or scratch) / f"serve-{scale}-1-and-2.log"
    with (
        serving_service(ports[1], 1, environment, log) as one,
        serving_service(ports[2], 2, environment, log) as two,
    ):
        drawn = asyncio.run(sample(url, credentials, rng))
        tag = f"s{scale}-workers-{secrets.token_hex(3)}"
        measured, _ = operations(urls[1], credentials, drawn, tag=tag)
        (verify,) = [operation for operation in measured if operation.key == "verify"]
        workers = {1: workers_of(one, 1), 2: workers_of(two, 2)}
        for count in (1, 2):
            preflight(urls[count], verify.load, f"{verify.label} on {count} worker(s)")
            run_wrk(urls[count], verify.load, seconds=args.warmup, connections=args.connections)
        postmaster = server_process(libpq(url))
        quiet = [*workers[1], *workers[2]]
        for repeat in range(args.repeat):
            timed = {}
            for count in (1, 2):
                quiesce(url, quiet)
                timed[count] = timed_load(
                    workers[count],
                    postmaster,
                    urls[count],
                    verify.load,
                    seconds=args.duration,
                    connections=args.connections,
                )
            comparison.pairs.append((timed[1], timed[2]))
            say(
                f"  [{repeat + 1}/{args.repeat}] verify on one worker"
                f" {timed[1].measured.rps:8.1f} req/s, on two {timed[2].measured.rps:8.1f} req/s"
                + _problems(("one worker", timed[1].measured), ("two", timed[2].measured))
            )
    return comparison


def _queued(loop: OpenLoop) -> str:
    """How the loop's requests queued, where they queued beyond the server's keeping up."""
    found = ""
    if loop.backlog_grew:
        tenths = loop.measured.tenths_p50_ms
        found += (
            f", p50 rising from {tenths[0]:.2f} ms in the first tenth of the requests to"
            f" {tenths[-1]:.2f} ms in the last"
        )
    if loop.queued_deeper:
        found += (
            f", p50 {loop.measured.p50_ms:.2f} ms over {QUEUED_OVER_FULL_RATE_P50:g} x the"
            f" {_ms(loop.saturated_p50_ms)} ms of the closed loop at the full rate"
        )
    return found


def _first_and_last(tenths: Sequence[float]) -> str:
    return f"{tenths[0]:.2f} / {tenths[-1]:.2f}" if tenths else "-"


def _ms(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _share(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def _problems(*named: tuple[str, Measurement]) -> str:
    failed = [
        f"{name}: {m.errors} errors, {m.unexpected} unexpected statuses"
        for name, m in named
        if m.failed
    ]
    return f"  !! {'; '.join(failed)}" if failed else ""


def profile_worker(
    args: argparse.Namespace,
    service_url: str,
    pid: int,
    measured: Sequence[Operation],
    scratch: Path,
) -> dict[str, Profile]:
    """py-spy on one worker under each load of `--profile-ops`, one after the other."""
    found: dict[str, Profile] = {}
    for operation in measured:
        if operation.key not in args.profile_ops:
            continue
        output = (args.artifacts or scratch) / f"profile-{operation.key}.txt"
        recorder = start_recording(pid, seconds=args.profile_seconds, output=output)
        time.sleep(0.5)
        run_wrk(
            service_url,
            operation.load,
            seconds=args.profile_seconds + 1,
            connections=args.connections,
        )
        _, errors = recorder.communicate(timeout=args.profile_seconds + 60)
        if recorder.returncode != 0 or not output.exists():
            say(f"  py-spy failed on {operation.key}: {errors.decode(errors='replace')[-300:]}")
            continue
        found[operation.key] = hot_spots(output.read_text())
        say(f"  profiled {operation.key}: {found[operation.key].samples} samples")
    return found


# --- report --------------------------------------------------------------------------------


def say(line: str) -> None:
    """Progress and results, as they come."""
    print(line, flush=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    say(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    )
    for row in rows:
        say(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def report_block(block: Block) -> None:
    say("")
    say(
        f"== {block.workers} worker(s), seeded to {block.scale:,} chunks and {block.scale:,}"
        " citations =="
    )
    say(
        "rows at start: "
        + ", ".join(f"{k} {v:,}" for k, v in block.rows_before.items())
        + "; at end: "
        + ", ".join(f"{k} {v:,}" for k, v in block.rows_after.items())
    )
    rows = []
    for kind in (READ, WRITE):
        results = [r for r in block.results.values() if r.kind == kind]
        if not results:
            continue
        floor_rps = block.floor_median(kind, lambda m: m.rps)
        floor_p50 = block.floor_median(kind, lambda m: m.p50_ms)
        floor_p99 = block.floor_median(kind, lambda m: m.p99_ms)
        floor_cpu = statistics.median(p.floor_cpu_ms for r in results for p in r.pairs)
        floor_database_cpu = median_of_known(
            p.floor_database_cpu_ms for r in results for p in r.pairs
        )
        floor_stolen = median_of_known(p.floor_stolen for r in results for p in r.pairs)
        rows.append(
            [
                f"floor {kind}",
                f"{floor_rps:.1f}",
                f"{floor_p50:.2f}",
                f"{floor_p99:.2f}",
                "1",
                "1",
                f"{floor_cpu:.2f}",
                "1",
                _ms(floor_database_cpu),
                _share(floor_stolen),
            ]
        )
        rows += [
            [
                f"  {r.label}",
                f"{r.rps:.1f}",
                f"{r.p50:.2f}",
                f"{r.p99:.2f}",
                f"{r.rps_ratio:.3f}",
                f"{r.p50_ratio:.2f}",
                f"{r.cpu_ms:.2f}",
                f"{r.cpu_ratio:.3f}",
                _ms(r.database_cpu_ms),
                _share(r.stolen),
            ]
            for r in results
        ]
    _table(
        [
            "operation",
            "req/s",
            "p50 ms",
            "p99 ms",
            "req/s / floor",
            "p50 / floor",
            "CPU ms/req",
            "floor CPU / CPU",
            "DB CPU ms/req",
            "stolen",
        ],
        rows,
    )
    loops = [(f"floor {kind}", loop) for kind, loop in block.floor_open_loops.items()]
    loops += [(f"  {r.key}", r.open_loop) for r in block.results.values() if r.open_loop]
    if loops:
        say(
            f"open loop at {RATE_SHARE:.0%} of each operation's rate, and of each floor's own"
            " (latency from due time; full-rate p50: the closed loop's, with every connection"
            " busy; a p50 at this share of the rate stays under"
            f" {QUEUED_OVER_FULL_RATE_P50:g} x it while the server keeps up;"
            " p50 first / last tenth: of the first and the last tenth of"
            " the requests in due order, alike unless a spell fell in one or a backlog grew; slow:"
            " over"
            f" {SLOW_OVER_P50} x p50, in spells of consecutive requests; autovacuum: tables it"
            " vacuumed or analyzed meanwhile; loop CPU: this process's, the generator's, share of"
            " a core; sent late: the most the generator sent"
            " a request after it was due, so a longer spell was the server's; waited: the share of"
            " the time some task waited for a core):"
        )
        _table(
            [
                "operation",
                "rate",
                "served",
                "p50 ms",
                "full-rate p50 ms",
                "p99 ms",
                "p99 / p50",
                "p50 first / last tenth ms",
                "failed",
                "slow",
                "spells",
                "longest ms",
                "autovacuum",
                "loop CPU",
                "sent late ms",
                "waited",
                "stolen",
            ],
            [
                [
                    label,
                    f"{loop.rate:.1f}",
                    f"{loop.measured.rps:.1f}",
                    f"{loop.measured.p50_ms:.2f}",
                    _ms(loop.saturated_p50_ms),
                    f"{loop.measured.p99_ms:.2f}",
                    "-" if loop.tail_ratio is None else f"{loop.tail_ratio:.2f}",
                    _first_and_last(loop.measured.tenths_p50_ms),
                    str(loop.measured.failed),
                    f"{loop.measured.slow.share:.1%}" if loop.measured.slow else "-",
                    str(loop.measured.slow.spells) if loop.measured.slow else "-",
                    f"{loop.measured.slow.longest_ms:.0f}" if loop.measured.slow else "-",
                    "-" if loop.autovacuum is None else str(loop.autovacuum),
                    _share(loop.measured.own_cpu_share),
                    _ms(loop.measured.late_ms),
                    _share(loop.cpu_waited),
                    _share(loop.stolen),
                ]
                for label, loop in loops
            ],
        )
    say(
        "peak RSS per service worker: "
        + ", ".join(f"{mb:.0f} MB" for mb in block.peak_rss_mb.values())
        + " (floor's workers: "
        + ", ".join(f"{mb:.0f} MB" for mb in block.floor_peak_rss_mb.values())
        + ")"
    )
    for note in block.notes:
        say(f"note: {note}")


def report_comparison(comparison: WorkerComparison) -> None:
    say("")
    say(f"== verification on one and two workers, loaded alternately, at {comparison.scale:,} ==")
    _table(
        ["repeat", "one worker req/s", "two workers req/s", "two / one"],
        [
            [
                str(repeat),
                f"{one.measured.rps:.1f}",
                f"{two.measured.rps:.1f}",
                f"{ratio:.2f}",
            ]
            for repeat, ((one, two), ratio) in enumerate(
                zip(comparison.pairs, comparison.ratios, strict=True), start=1
            )
        ],
    )
    say(f"median of the repeats' ratios: {comparison.ratio:.2f}")


def report_profiles(block: Block) -> None:
    for key, found in block.profiles.items():
        say("")
        say(
            f"== hot spots under {key} ({block.workers} worker, {block.scale:,}):"
            f" {found.samples} busy samples =="
        )
        _table(
            ["own (leaf) function", "own %", "total %"],
            [[f"  {h.function}", f"{h.own:.1f}", f"{h.total:.1f}"] for h in found.by_own],
        )
        say(
            "own share by package: "
            + ", ".join(f"{h.function} {h.own:.1f}%" for h in found.by_package if h.own >= 0.5)
        )
        _table(
            ["service code, inclusive", "own %", "total %"],
            [[f"  {h.function}", f"{h.own:.1f}", f"{h.total:.1f}"] for h in found.by_total_in_app],
        )


@dataclass(frozen=True, slots=True)
class Check:
    """A target: what it holds against, the figure found, and whether it passed."""

    target: str
    found: str
    passed: bool


def checks(
    blocks: Sequence[Block],
    seeding: Sequence[tuple[int, SeedReport]],
    comparisons: Sequence[WorkerComparison] = (),
    cores: int = os.cpu_count() or 1,
) -> list[Check]:
    """Every target the run measured, on a machine of `cores` cores."""
    found: list[Check] = []
    shares = (
        ("verify", 0.6, "grounded verification >= 0.6 x write floor req/s"),
        ("excerpt", 0.75, "excerpt >= 0.75 x read floor req/s"),
        ("runs", 0.5, "POST /runs (20 results) >= 0.5 x write floor req/s"),
        ("resolve", 0.3, "resolve of 100 ids >= 0.3 x read floor req/s"),
    )
    for block in blocks:
        where = f"[{block.workers}w, {block.scale:,}]"
        for key, share, target in shares:
            if key in block.results:
                ratio = block.results[key].rps_ratio
                found.append(Check(f"{where} {target}", f"{ratio:.3f}", ratio >= share))
        for result in block.results.values():
            loop = result.open_loop
            if loop is None or loop.tail_ratio is None:
                continue
            shown = f"{loop.tail_ratio:.2f}"
            if not loop.kept_up:
                shown += (
                    f" (did not keep up: {loop.measured.rps:.1f} of {loop.rate:.1f} req/s served,"
                    f" {loop.measured.failed} failed{_queued(loop)})"
                )
            floors_loop = block.floor_open_loops.get(result.kind)
            if floors_loop is not None and floors_loop.tail_ratio is not None:
                # A floor's loop that queued has a p99 / p50 of its queue: no tail to compare.
                queued = "" if floors_loop.kept_up else ", its loop did not keep up"
                shown += f" (the {result.kind} floor's own: {floors_loop.tail_ratio:.2f}{queued})"
            found.append(
                Check(
                    f"{where} {result.key}: p99 <= {SLOW_OVER_P50} x p50"
                    f" at {RATE_SHARE:.0%} of max rate",
                    shown,
                    loop.tail_ratio <= SLOW_OVER_P50 and loop.kept_up,
                )
            )
        peak = max(block.peak_rss_mb.values(), default=0.0)
        found.append(Check(f"{where} peak RSS <= 200 MB per worker", f"{peak:.0f} MB", peak <= 200))
    scales = sorted({b.scale for b in blocks})
    for workers in sorted({b.workers for b in blocks}):
        by_scale = {b.scale: b for b in blocks if b.workers == workers}
        if len(scales) < 2:
            continue
        small, large = by_scale[scales[0]], by_scale[scales[-1]]
        for key, result in large.results.items():
            if key in small.results:
                # Each size's p50 over its own floor's, measured beside it: the sizes are
                # measured many minutes apart, and a shared machine's speed drifts between them
                # as much as the target allows. The raw ratio is shown beside it.
                ratio = result.p50_ratio / small.results[key].p50_ratio
                raw = result.p50 / small.results[key].p50
                found.append(
                    Check(
                        f"[{workers}w] {key}: p50 at {scales[-1]:,} <= 1.25 x p50 at"
                        f" {scales[0]:,} (each over its floor's p50)",
                        # Three places: a ratio just over the bound must not read as the bound.
                        f"{ratio:.3f} (raw {raw:.2f})",
                        ratio <= 1.25,
                    )
                )
    for scale, seeded in seeding:
        found.append(
            Check(
                f"seeding to {scale:,} >= 50,000 chunks/s",
                f"{seeded.chunks_per_second:,.0f}",
                seeded.chunks_per_second >= 50_000,
            )
        )
    for comparison in comparisons:
        ratio = comparison.ratio
        found.append(
            Check(
                f"[{comparison.scale:,}] two workers >= 1.6 x one worker's verification req/s"
                " (loaded alternately)",
                f"{ratio:.2f}{_what_the_cores_allow(comparison.one_worker_busy, cores)}",
                ratio >= 1.6,
            )
        )
    return found


def _what_the_cores_allow(busy: CoresBusy, cores: int) -> str:
    """What one worker's load left of the cores for a second one, as the two-worker check's
    aside; nothing when no time was measured."""
    if not busy.total:
        return ""
    database = "not on this machine" if busy.database is None else f"{busy.database:.2f}"
    return (
        f" (one worker's load kept {busy.total:.2f} of the {cores} cores busy: the worker"
        f" {busy.workers:.2f}, PostgreSQL {database}, wrk {busy.generator:.2f}; so the cores"
        f" allow at most {cores / busy.total:.2f} x)"
    )


def report_scaling(blocks: Sequence[Block]) -> None:
    scales = sorted({b.scale for b in blocks})
    if len(scales) < 2:
        return
    for workers in sorted({b.workers for b in blocks}):
        by_scale = {b.scale: b for b in blocks if b.workers == workers}
        small, large = by_scale[scales[0]], by_scale[scales[-1]]
        say("")
        say(f"== {workers} worker(s): {scales[-1]:,} against {scales[0]:,} ==")
        _table(
            [
                "operation",
                "p50 small",
                "p50 large",
                "p50 ratio",
                "(p50/floor) ratio",
                "req/s ratio",
            ],
            [
                [
                    f"  {key}",
                    f"{small.results[key].p50:.2f}",
                    f"{r.p50:.2f}",
                    f"{r.p50 / small.results[key].p50:.2f}",
                    f"{r.p50_ratio / small.results[key].p50_ratio:.2f}",
                    f"{r.rps / small.results[key].rps:.2f}",
                ]
                for key, r in large.results.items()
                if key in small.results
            ],
        )


# --- main ----------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The command line."""
    root = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    root.add_argument(
        "--workers", type=int, nargs="+", default=[1], help="worker counts to measure (default 1)"
    )
    root.add_argument(
        "--scales",
        type=int,
        nargs="+",
        default=[10_000, 1_000_000],
        help="database sizes, in chunks and in citations (default 10000 1000000)",
    )
    root.add_argument("--duration", type=float, default=10, help="seconds per measurement")
    root.add_argument("--warmup", type=float, default=3, help="seconds of warm-up per load")
    root.add_argument("--repeat", type=int, default=3, help="measurements per operation")
    root.add_argument("--connections", type=int, default=32, help="wrk's connections")
    root.add_argument("--database-url", help="a PostgreSQL server as the schema's owner")
    root.add_argument("--no-rate-check", action="store_true", help="skip the open-loop check")
    root.add_argument("--no-profile", action="store_true", help="skip py-spy")
    root.add_argument("--profile-seconds", type=float, default=10, help="py-spy per load")
    root.add_argument(
        "--profile-ops",
        nargs="+",
        default=["verify", "runs"],
        help="operations to profile (default verify runs; also excerpt resolve audit reject"
        " register)",
    )
    root.add_argument(
        "--ops",
        nargs="+",
        help="measure only these operations (default all: excerpt resolve audit verify reject"
        " runs register)",
    )
    root.add_argument(
        "--artifacts", type=Path, help="keep the servers' logs and py-spy's stacks in this folder"
    )
    root.add_argument("--json", type=Path, help="also write every figure to this file")
    return root


def missing_tools(args: argparse.Namespace) -> list[str]:
    """What the run needs and this machine lacks, with how to get it."""
    missing = []
    if wrk_path() is None:
        missing.append(
            "wrk is not installed: `apt-get install wrk` (Debian, Ubuntu), `brew install wrk`"
            " (macOS), or build it from its source"
        )
    if not args.no_profile and py_spy_path() is None:
        missing.append(
            "py-spy is not installed: `.venv/bin/pip install py-spy`, or run with --no-profile"
        )
    return missing


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its report."""
    args = parser().parse_args(argv)
    if args.artifacts:
        args.artifacts.mkdir(parents=True, exist_ok=True)
    missing = missing_tools(args)
    if missing:
        raise SystemExit("\n".join(missing))
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    say(MACHINE_NOTE.format(cpus=os.cpu_count()))
    rng = random.Random(20261203)
    blocks: list[Block] = []
    comparisons: list[WorkerComparison] = []
    seeding: list[tuple[int, SeedReport]] = []
    seeding_stolen: dict[int, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="grounding-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        with database(args, scratch) as url:
            environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
            environment["DATABASE_URL"] = url
            tenant = f"bench-{secrets.token_hex(3)}"
            grounding(environment, "tenants", "create", tenant)
            printed = (
                grounding(
                    environment,
                    "keys",
                    "create",
                    "--tenant",
                    tenant,
                    "--scopes",
                    "ingest,agent,support,audit",
                )
                .strip()
                .splitlines()
            )
            seed_key = (
                grounding(environment, "keys", "create", "--tenant", tenant, "--scopes", "agent")
                .strip()
                .splitlines()
            )
            credentials = Credentials(
                tenant=tenant,
                secret=printed[-1],
                key_id=printed[-2].split()[1],
                seed_key_id=seed_key[-2].split()[1],
            )
            seeder = Seeder(tenant=tenant, key_id=credentials.seed_key_id)
            seeded = 0
            owner = libpq(url)
            for scale in sorted(args.scales):
                say(f"seeding {scale - seeded:,} chunks and as many citations (COPY) ...")
                machine_before = psutil.cpu_times()
                report = asyncio.run(
                    seeder.seed(owner, chunks=scale - seeded, citations=scale - seeded)
                )
                seeding_stolen[scale] = stolen_share(machine_before, psutil.cpu_times())
                seeded = scale
                seeding.append((scale, report))
                vacuumed = asyncio.run(vacuum(owner, SEEDED_TABLES))
                say(
                    f"  {report.chunks:,} chunks, {report.citations:,} citations in"
                    f" {report.seconds:.1f} s: {report.chunks_per_second:,.0f} chunks/s"
                    f" ({report.rows_per_second:,.0f} rows/s over the six tables;"
                    f" stolen {_share(seeding_stolen[scale])});"
                    f" VACUUM ANALYZE after it {vacuumed:.1f} s"
                )
                mark = asyncio.run(audit_mark(owner, tenant))
                for workers in args.workers:
                    say(f"measuring {workers} worker(s) at {scale:,} ...")
                    block = measure_block(
                        args,
                        url=url,
                        scratch=scratch,
                        credentials=credentials,
                        scale=scale,
                        workers=workers,
                        profile=not args.no_profile and not blocks,
                        rng=rng,
                    )
                    blocks.append(block)
                    report_block(block)
                    asyncio.run(forget_block_writes(owner, credentials, mark))
                if {1, 2} <= set(args.workers) and (not args.ops or "verify" in args.ops):
                    say(f"comparing one and two workers at {scale:,} ...")
                    comparison = compare_workers(
                        args,
                        url=url,
                        scratch=scratch,
                        credentials=credentials,
                        scale=scale,
                        rng=rng,
                    )
                    comparisons.append(comparison)
                    report_comparison(comparison)
                    asyncio.run(forget_block_writes(owner, credentials, mark))
    say("")
    say(MACHINE_NOTE.format(cpus=os.cpu_count()))
    for block in blocks:
        report_block(block)
    for comparison in comparisons:
        report_comparison(comparison)
    report_scaling(blocks)
    for block in blocks:
        report_profiles(block)
    say("")
    say("== targets ==")
    found = checks(blocks, seeding, comparisons)
    for check in found:
        say(f"{'PASS' if check.passed else 'FAIL'}  {check.target}: {check.found}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "seeding": [
                        {"scale": s, **asdict(r), "stolen": seeding_stolen[s]} for s, r in seeding
                    ],
                    "blocks": [asdict(b) for b in blocks],
                    "worker_comparisons": [asdict(c) for c in comparisons],
                    "checks": [asdict(c) for c in found],
                },
                indent=2,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
