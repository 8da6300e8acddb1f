"""Load generators: wrk (closed loop, most requests per second) and a constant-rate open loop.

wrk drives each measurement through a generated Lua script that pre-formats the requests and
rotates through them, or, for a body that must differ each time, splices a counter into it.
Its `done` hook prints the counts and percentiles this module parses.

wrk waits for each response before sending the next request on a connection, so its latencies
leave out the queueing a constant arrival rate would see. `constant_rate` is the open loop for
the tail check: requests are due at fixed intervals whatever the server does, and each one's
latency counts from when it was due (as wrk2 corrects for), over keep-alive connections.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

RESULT_MARK = "BENCH_RESULT"
COUNTER = "@@counter@@"


@dataclass(frozen=True, slots=True)
class Load:
    """What one operation sends: requests taken in turn, each `(path, body)`.

    A body holding `COUNTER` gets a fresh value there on every request (`tag`, the thread
    and a running number), so a registration never repeats a version.
    """

    method: str
    requests: tuple[tuple[str, str | None], ...]
    headers: Mapping[str, str] = field(default_factory=dict)
    expect: int = 200
    tag: str = "m"


# A request slower than this many times the median is slow: the tail check's own bound.
SLOW_OVER_P50 = 4


@dataclass(frozen=True, slots=True)
class SlowSpells:
    """The open loop's slow requests, as stretches of consecutive ones (in due order).

    Scattered slow requests are queueing; one long spell is the server falling behind the
    arrivals for that long (a pause, or the cores taken by something else), and a spell of
    half a second holds over 1% of a ten-second loop, enough alone to set its p99.
    """

    spells: int
    longest_ms: float
    share: float


@dataclass(frozen=True, slots=True)
class Measurement:
    """One load generator's run against one operation; the open loop also says how its slow
    requests fell (`SlowSpells`) and what CPU it took itself."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    unexpected: int
    slow: SlowSpells | None = None
    own_cpu_share: float | None = None
    # The most any request was sent after it was due: the generator's own lateness. A spell
    # longer than this was the server's, not a pause of the generator.
    late_ms: float | None = None
    # The median latency of each tenth of the requests, in due order. Where the server serves
    # the rate, they are alike but for a spell here and there; where it falls behind, each
    # request waits behind all the ones before it, and each tenth waits longer than the last.
    tenths_p50_ms: tuple[float, ...] = ()

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def failed(self) -> int:
        """Requests that failed: on the connection, or with a status other than expected."""
        return self.errors + self.unexpected


def wrk_path() -> str | None:
    """The wrk binary, if installed."""
    return shutil.which("wrk")


def _lua_string(value: str) -> str:
    level = 1
    while f"]{'=' * level}]" in value:
        level += 1
    return f"[{'=' * level}[{value}]{'=' * level}]"


def _lua_headers(headers: Mapping[str, str]) -> str:
    return (
        "{"
        + ", ".join(f"[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in headers.items())
        + "}"
    )


def lua_script(load: Load) -> str:
    """The wrk script for `load`: rotation or counter, and a `done` that prints the results."""
    headers = _lua_headers(load.headers)
    method = _lua_string(load.method)
    lines = [f"local headers = {headers}", "local counter = 0", "local thread_id = 0"]
    countered = [body for _, body in load.requests if body is not None and COUNTER in body]
    if countered:
        path, body = load.requests[0]
        assert body is not None
        prefix, suffix = body.split(COUNTER, 1)
        lines += [
            f"local path = {_lua_string(path)}",
            f"local prefix = {_lua_string(prefix)}",
            f"local suffix = {_lua_string(suffix)}",
            "local threads = 0",
            "function setup(thread) thread:set('thread_id', threads); threads = threads + 1 end",
            "function request()",
            "  counter = counter + 1",
            f"  local value = {_lua_string(load.tag)} .. '-' .. thread_id .. '-' .. counter",
            f"  return wrk.format({method}, path, headers, prefix .. value .. suffix)",
            "end",
        ]
    else:
        entries = ",\n".join(
            f"  {{{_lua_string(path)}, {'nil' if body is None else _lua_string(body)}}}"
            for path, body in load.requests
        )
        lines += [
            f"local entries = {{\n{entries}\n}}",
            "local formatted = {}",
            "function init(args)",
            "  for i, entry in ipairs(entries) do",
            f"    formatted[i] = wrk.format({method}, entry[1], headers, entry[2])",
            "  end",
            "end",
            "function request()",
            "  counter = counter % #formatted + 1",
            "  return formatted[counter]",
            "end",
        ]
    lines += [
        "function done(summary, latency, requests)",
        "  local e = summary.errors",
        f"  io.write(string.format('{RESULT_MARK} %d %d %d %d %d %d %d %d %d\\n',",
        "    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),",
        "    e.connect, e.read, e.write, e.status, e.timeout))",
        "end",
    ]
    return "\n".join(lines) + "\n"


def run_wrk(
    base_url: str, load: Load, *, seconds: float, connections: int, threads: int = 1
) -> Measurement:
    """Run wrk against `base_url` with `load` and parse what its script printed."""
    binary = wrk_path()
    if binary is None:
        raise RuntimeError("wrk is not installed")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua_script(load))
    try:
        done = subprocess.run(
            [
                binary,
                f"-t{threads}",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "30s",
                "-s",
                script.name,
                base_url,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 120,
        )
    finally:
        Path(script.name).unlink()
    line = next((x for x in done.stdout.splitlines() if x.startswith(RESULT_MARK)), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result: {done.stdout[-500:]} {done.stderr[-500:]}")
    requests, micros, p50, p99, connect, read, write, status, timeout = map(int, line.split()[1:])
    # wrk counts statuses of 400 and up as errors: expected ones (a 422 rejection) are not.
    unexpected = requests - status if load.expect >= 400 else status
    return Measurement(
        requests=requests,
        seconds=micros / 1e6,
        p50_ms=p50 / 1000,
        p99_ms=p99 / 1000,
        errors=connect + read + write + timeout,
        unexpected=unexpected,
    )


def _raw_requests(load: Load, host: str) -> Iterator[bytes]:
    counter = itertools.count(1)
    for path, body in itertools.cycle(load.requests):
        head = [f"{load.method} {path} HTTP/1.1", f"Host: {host}"]
        head += [f"{k}: {v}" for k, v in load.headers.items()]
        payload = b""
        if body is not None:
            payload = body.replace(COUNTER, f"{load.tag}-open-{next(counter)}").encode("utf-8")
            head.append(f"Content-Length: {len(payload)}")
        yield ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + payload


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        elif name.strip().lower() == "transfer-encoding":
            raise RuntimeError("chunked responses are not read by the open loop")
    await reader.readexactly(length)
    return status


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection in this process while it times requests, as `timeit` does: the
    benchmark's process holds a large heap, and one full collection of it (up to 80 ms) would
    count as the service's latency for every request due meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def slow_spells(timed: Sequence[tuple[float, float]], bound: float) -> SlowSpells:
    """The spells of requests slower than `bound`, from `(due, latency)` pairs in seconds.

    A spell lasts from its first request's due time until its last request's response.
    """
    spells = 0
    longest = 0.0
    slow = 0
    first_due: float | None = None
    for due, latency in sorted(timed):
        if latency <= bound:
            first_due = None
            continue
        slow += 1
        if first_due is None:
            first_due = due
            spells += 1
        longest = max(longest, due + latency - first_due)
    return SlowSpells(
        spells=spells, longest_ms=longest * 1000, share=slow / len(timed) if timed else 0.0
    )


async def constant_rate(
    host: str, port: int, load: Load, *, rate: float, seconds: float, connections: int
) -> Measurement:
    """Send `load` at `rate` requests per second for `seconds`, open loop; latency from due time.

    Its own CPU share is this process's while it runs: what the generator takes of the cores it
    shares with the server.
    """
    raw = _raw_requests(load, f"{host}:{port}")
    total = max(1, int(rate * seconds))
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    timed: list[tuple[float, float]] = []
    statuses: list[int] = []
    errors = 0

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while (item := await queue.get()) is not None:
                due, request = item
                try:
                    statuses.append(await _exchange(reader, writer, request))
                except (OSError, asyncio.IncompleteReadError):
                    errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    continue
                timed.append((due, time.perf_counter() - due))
        finally:
            writer.close()

    workers = [asyncio.create_task(connection()) for _ in range(connections)]
    # Build the requests before the clock starts, so making them costs no latency.
    prepared = [next(raw) for _ in range(total)]
    with _collector_paused():
        cpu_before = time.process_time()
        started = time.perf_counter()
        late = 0.0
        for i, request in enumerate(prepared):
            due = started + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late = max(late, -delay)
            queue.put_nowait((due, request))
        for _ in workers:
            queue.put_nowait(None)
        await asyncio.gather(*workers)
        elapsed = time.perf_counter() - started
        own_cpu = time.process_time() - cpu_before
    ordered = sorted(latency for _, latency in timed)
    p50 = statistics.median(ordered) if ordered else 0.0
    return Measurement(
        requests=len(ordered),
        seconds=elapsed,
        p50_ms=p50 * 1000,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000 if ordered else 0.0,
        errors=errors,
        unexpected=sum(1 for s in statuses if s != load.expect),
        slow=slow_spells(timed, SLOW_OVER_P50 * p50),
        own_cpu_share=own_cpu / elapsed if elapsed else None,
        late_ms=late * 1000,
        tenths_p50_ms=tenths_p50_ms(timed),
    )


def tenths_p50_ms(timed: Sequence[tuple[float, float]]) -> tuple[float, ...]:
    """The median latency, in ms, of each tenth of `(due, latency)` pairs in due order; none
    when there are fewer than ten pairs."""
    by_due = [latency for _, latency in sorted(timed)]
    if len(by_due) < 10:
        return ()
    return tuple(
        1000 * statistics.median(by_due[len(by_due) * k // 10 : len(by_due) * (k + 1) // 10])
        for k in range(10)
    )
