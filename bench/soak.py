"""The soak: `python -m bench.soak` (or `make soak`); `--help` lists the options.

It starts `grounding serve` on loopback on a fresh embedded PostgreSQL in a temporary directory,
registers a small corpus (one version of it erased, so resolves meet tombstones), and holds a
steady mixed load for `--seconds` (600 by default) at `--rate` requests a second from a few
clients, each request bounded by a timeout and the whole by `--max-requests`: record a run
(cite), verify an answer that passes and one that fails, read an excerpt, resolve a batch of
ids, and read the audit trail. It samples the service's resident memory with psutil as it goes,
then checks the database as its owner: the rows written equal the writes acknowledged, and
every run and verification is whole. It prints the requests served, the errors by status, the
latency percentiles, the memory over time (and whether it is flat after the warm-up), and the
consistency check, and exits non-zero on any 5xx, unexpected status, lost write or partial row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil

from bench.run import HOST, free_port, grounding, grounding_command, serving

TENANT = "soak"
DOCUMENTS = 8
CHUNKS = 60
RESULTS_PER_RUN = 5
RESOLVE_IDS = 10
# What each operation may answer; anything else is counted as an error.
EXPECTED = {
    "cite": {201},
    "verify_pass": {200},
    "verify_fail": {422},
    "excerpt": {200},
    "resolve": {200},
    "audit": {200},
}


@dataclass
class Tally:
    """Every request's operation, status and latency, as the load sent them."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[tuple[str, int | None]] = field(default_factory=Counter)
    acknowledged: Counter[str] = field(default_factory=Counter)
    citations_issued: int = 0

    def add(self, operation: str, status: int | None, seconds: float) -> None:
        self.latencies.setdefault(operation, []).append(seconds)
        self.statuses[(operation, status)] += 1

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def unexpected(self) -> Counter[tuple[str, int | None]]:
        return Counter(
            {key: n for key, n in self.statuses.items() if key[1] not in EXPECTED[key[0]]}
        )


class MemorySampler:
    """Samples a process's resident set size (with its children's) every `interval` seconds."""

    def __init__(self, pid: int, *, interval: float) -> None:
        self._process = psutil.Process(pid)
        self._interval = interval
        self._stop = threading.Event()
        self.samples: list[tuple[float, float]] = []
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _rss(self) -> float:
        processes = [self._process, *self._process.children(recursive=True)]
        total = 0
        for process in processes:
            try:
                if process.name() != "postgres":
                    total += process.memory_info().rss
            except psutil.Error:
                continue
        return total / 2**20

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self._began, self._rss()))
            self._stop.wait(self._interval)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Pacer:
    """Spreads requests evenly at `rate` a second across every client, up to `budget` of them."""

    def __init__(self, rate: float, budget: int, deadline: float) -> None:
        self._interval = 1 / rate
        self._next = time.monotonic()
        self._left = budget
        self._deadline = deadline

    @property
    def spent(self) -> bool:
        """Whether the time or the request budget is spent."""
        return self._left <= 0 or time.monotonic() >= self._deadline

    async def turn(self) -> bool:
        """Wait for the next slot; False once the time or the request budget is spent."""
        if self.spent:
            return False
        self._left -= 1
        slot, self._next = self._next, max(self._next + self._interval, time.monotonic())
        await asyncio.sleep(max(0.0, slot - time.monotonic()))
        return time.monotonic() < self._deadline


@dataclass
class Corpus:
    """What the load cites: live documents' chunks, and the ids it has seen issued."""

    chunks: list[dict[str, Any]]
    documents: list[str]
    tombstones: list[str]
    recent: list[str] = field(default_factory=list)


def _sentences(count: int) -> tuple[str, list[dict[str, Any]]]:
    sentences = [f"Rule {i}: refunds 🧾 返金 within {i} days, cafe\u0301. " for i in range(count)]
    chunks, start = [], 0
    for i, sentence in enumerate(sentences):
        chunks.append({"chunk_id": f"r{i}", "start": start, "end": start + len(sentence)})
        start += len(sentence)
    return "".join(sentences), chunks


async def _prepare(client: httpx.AsyncClient) -> Corpus:
    text, chunks = _sentences(CHUNKS)
    documents = [f"policy-{i}" for i in range(DOCUMENTS)]
    for document in [*documents, "erased-policy"]:
        response = await client.post(
            f"/v1/documents/{document}/versions",
            json={"version": "v1", "text": text, "chunks": chunks, "title": document},
        )
        response.raise_for_status()
    run = await client.post(
        "/v1/runs", json={"results": _results("erased-policy", chunks[:RESOLVE_IDS])}
    )
    run.raise_for_status()
    erased = await client.post(
        "/v1/documents/erased-policy/erase",
        json={"reason": "soak", "request_ref": "DSR-soak"},
    )
    erased.raise_for_status()
    tombstones = [c["citation_id"] for c in run.json()["citations"]]
    return Corpus(chunks=chunks, documents=documents, tombstones=tombstones)


def _results(document: str, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "document_id": document,
            "version": "v1",
            "chunk_id": c["chunk_id"],
            "start": c["start"],
            "end": c["end"],
            "score": 0.9,
            "branches": {"bm25": 11.2, "vector": 0.79},
        }
        for c in chunks
    ]


async def _client_loop(
    client: httpx.AsyncClient, corpus: Corpus, pacer: Pacer, tally: Tally, seed: int
) -> None:
    rng = random.Random(seed)

    async def send(operation: str, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """The response, or None when there was none (or the budget is spent)."""
        if not await pacer.turn():
            return None
        began = time.monotonic()
        try:
            response = await client.request(method, path, **kwargs)
        except httpx.TransportError:
            tally.add(operation, None, time.monotonic() - began)
            return None
        tally.add(operation, response.status_code, time.monotonic() - began)
        return response

    cycle = 0
    while not pacer.spent:
        cycle += 1
        document = rng.choice(corpus.documents)
        first = rng.randrange(len(corpus.chunks) - RESULTS_PER_RUN)
        picked = corpus.chunks[first : first + RESULTS_PER_RUN]
        run = await send(
            "cite",
            "POST",
            "/v1/runs",
            json={"query": f"q{cycle}", "results": _results(document, picked)},
        )
        if run is None or run.status_code != 201:
            continue
        tally.acknowledged["runs"] += 1
        issued = run.json()["citations"]
        tally.citations_issued += len(issued)
        ids = [c["citation_id"] for c in issued]
        corpus.recent = (corpus.recent + ids)[-500:]
        passed = await send(
            "verify_pass",
            "POST",
            f"/v1/runs/{run.json()['run_id']}/answers",
            json={
                "claims": [{"text": "Refunds take days.", "citation_ids": ids[:2]}],
                "citations": issued,
            },
        )
        if passed is not None and passed.status_code == 200:
            tally.acknowledged["verifications"] += 1
        if cycle % 2 == 0:
            failed = await send(
                "verify_fail",
                "POST",
                f"/v1/runs/{run.json()['run_id']}/answers",
                json={"claims": [{"text": "Uncited.", "citation_ids": []}], "citations": issued},
            )
            if failed is not None and failed.status_code == 422:
                tally.acknowledged["verifications"] += 1
        await send("excerpt", "GET", f"/v1/citations/{rng.choice(ids)}/excerpt")
        asked = rng.sample(corpus.recent, min(RESOLVE_IDS - 2, len(corpus.recent)))
        asked += [rng.choice(corpus.tombstones), "cit_not_issued"]
        await send("resolve", "POST", "/v1/citations/resolve", json={"citation_ids": asked})
        if cycle % 5 == 0:
            path = rng.choice(
                ["/v1/audit/runs?limit=20", "/v1/audit/verifications?limit=20", "/v1/audit/stats"]
            )
            await send("audit", "GET", path)


async def _load(args: argparse.Namespace, base_url: str, secret: str, tally: Tally) -> None:
    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=args.timeout,
        limits=limits,
    ) as client:
        corpus = await _prepare(client)
        pacer = Pacer(args.rate, args.max_requests, time.monotonic() + args.seconds)
        await asyncio.gather(
            *(_client_loop(client, corpus, pacer, tally, seed) for seed in range(args.clients))
        )


async def _consistency(socket_dir: str, tally: Tally) -> dict[str, tuple[int, int]]:
    """Rows in the database against the writes the load was acknowledged, by table."""
    owner = await asyncpg.connect(host=socket_dir, user="postgres", database="postgres")
    try:
        # The setup wrote one run (the erased version's) before the load began.
        runs = await owner.fetchval("SELECT count(*) FROM runs WHERE tenant = $1", TENANT) - 1
        citations = (
            await owner.fetchval("SELECT count(*) FROM citations WHERE tenant = $1", TENANT)
            - RESOLVE_IDS
        )
        verifications = await owner.fetchval(
            "SELECT count(*) FROM verifications WHERE tenant = $1", TENANT
        )
        partial_runs = await owner.fetchval(
            """SELECT count(*) FROM runs r WHERE r.citation_count <> (SELECT count(*)
                 FROM citations c WHERE c.tenant = r.tenant AND c.run_id = r.run_id)"""
        )
        unaudited = await owner.fetchval(
            """SELECT count(*) FROM (
                 SELECT run_id AS id FROM runs UNION ALL SELECT verification_id FROM verifications
               ) AS records
               WHERE (SELECT count(*) FROM audit_entries a WHERE a.record_id = records.id) <> 1"""
        )
    finally:
        await owner.close()
    return {
        "runs": (runs, tally.acknowledged["runs"]),
        "citations": (citations, tally.citations_issued),
        "verifications": (verifications, tally.acknowledged["verifications"]),
        "runs without all their citations": (partial_runs, 0),
        "records without exactly one audit entry": (unaudited, 0),
    }


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000


def _memory_verdict(samples: list[tuple[float, float]], warm_up: float) -> tuple[float, float]:
    """Growth after the warm-up: MiB from its first sample to the last, and MiB a minute."""
    after = [(t, rss) for t, rss in samples if t >= warm_up]
    if len(after) < 3:
        return 0.0, 0.0
    slope = statistics.linear_regression([t for t, _ in after], [r for _, r in after]).slope
    return after[-1][1] - after[0][1], slope * 60


def _report(
    args: argparse.Namespace,
    tally: Tally,
    samples: list[tuple[float, float]],
    consistency: dict[str, tuple[int, int]],
    elapsed: float,
) -> bool:
    print(f"soak: {tally.total} requests in {elapsed:.0f} s ({tally.total / elapsed:.1f}/s)")
    by_status = Counter(status for (_, status), n in tally.statuses.items() for _ in range(n))
    print("statuses:", ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items(), key=str)))
    server_errors = sum(n for (_, s), n in tally.statuses.items() if s is not None and s >= 500)
    unexpected = tally.unexpected()
    print(f"5xx: {server_errors}; unexpected: {dict(unexpected) or 'none'}")
    every = [s for values in tally.latencies.values() for s in values]
    print(f"latency: p50 {_percentile(every, 0.5):.1f} ms, p99 {_percentile(every, 0.99):.1f} ms")
    for operation, values in sorted(tally.latencies.items()):
        print(
            f"  {operation:12} {len(values):7} requests  p50 {_percentile(values, 0.5):7.1f} ms"
            f"  p99 {_percentile(values, 0.99):7.1f} ms"
        )
    peak = max((rss for _, rss in samples), default=0.0)
    growth, per_minute = _memory_verdict(samples, args.warm_up)
    flat = abs(growth) <= args.flat_mib
    print(f"rss: peak {peak:.1f} MiB; after {args.warm_up:.0f} s warm-up {growth:+.1f} MiB")
    print(f"     ({per_minute:+.2f} MiB/min): {'flat' if flat else 'GROWING'}")
    step = max(1, len(samples) // 20)
    print("rss over time:", ", ".join(f"{t:.0f}s {rss:.1f}" for t, rss in samples[::step]))
    consistent = all(rows == expected for rows, expected in consistency.values())
    for name, (rows, expected) in consistency.items():
        print(f"  {name}: {rows} in the database, {expected} expected")
    print(f"consistency: {'rows equal acknowledged writes' if consistent else 'MISMATCH'}")
    return server_errors == 0 and not unexpected and consistent and flat


@contextmanager
def _embedded(scratch: Path, args: argparse.Namespace) -> Iterator[tuple[str, int, str, str]]:
    """Serve on a fresh embedded database; (base URL, pid, key secret, socket directory)."""
    data_dir = scratch / "data"
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    environment |= {"GROUNDING_DATA_DIR": str(data_dir), "GROUNDING_WORKERS": str(args.workers)}
    port = free_port()
    command = [*grounding_command(), "serve", "--host", HOST, "--port", str(port)]
    base_url = f"http://{HOST}:{port}"
    with serving(command, environment, f"{base_url}/readyz", scratch / "serve.log") as process:
        grounding(environment, "tenants", "create", TENANT)
        printed = grounding(
            environment,
            "keys",
            "create",
            "--tenant",
            TENANT,
            "--scopes",
            "ingest,agent,support,audit",
        )
        socket_dir = (data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[4]
        yield base_url, process.pid, printed.strip().splitlines()[-1], socket_dir.strip()


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    options.add_argument("--seconds", type=float, default=600, help="how long to hold the load")
    options.add_argument("--rate", type=float, default=60, help="requests a second, all clients")
    options.add_argument("--clients", type=int, default=4, help="concurrent clients")
    options.add_argument("--max-requests", type=int, help="at most (default: rate x seconds)")
    options.add_argument("--timeout", type=float, default=30, help="seconds a request may take")
    options.add_argument("--workers", type=int, default=1, help="worker processes of serve")
    options.add_argument(
        "--sample-every", type=float, default=5, help="seconds between RSS samples"
    )
    options.add_argument("--warm-up", type=float, default=60, help="seconds before RSS is judged")
    options.add_argument("--flat-mib", type=float, default=20, help="growth still called flat")
    return options


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.max_requests is None:
        args.max_requests = int(args.rate * args.seconds)
    args.warm_up = min(args.warm_up, args.seconds / 3)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="grounding-soak-") as scratch:
        with _embedded(Path(scratch), args) as (base_url, pid, secret, socket_dir):
            began = time.monotonic()
            with MemorySampler(pid, interval=args.sample_every) as memory:
                asyncio.run(_load(args, base_url, secret, tally))
            elapsed = time.monotonic() - began
            consistency = asyncio.run(_consistency(socket_dir, tally))
        ok = _report(args, tally, memory.samples, consistency, elapsed)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
