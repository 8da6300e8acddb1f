"""The floor: what the stack alone costs, served the way `grounding serve` serves the service.

The same framework (FastAPI), server (uvicorn with the same flags and worker count) and
PostgreSQL as the service, on a raw asyncpg pool of the same size per worker, with the same
garbage collector settings and two routes and nothing else: no authentication, no ORM, no
row-level security, no audit. An operation's rate over its floor's says how much of the stack's
capacity the service's own work leaves.

- `GET /floor/read/{id}`: one primary-key read;
- `POST /floor/write`: in one transaction, a read of the row the body names (`ref`) and an
  insert of the body (about 1 KB) as a jsonb row.

`python -m bench.floor --port P --workers N --pool-size S` serves it against
`BENCH_FLOOR_DATABASE_URL`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from fastapi import FastAPI, HTTPException, Request, status

from app.collector import serving_collector

TABLE = "bench_floor"
URL_VARIABLE = "BENCH_FLOOR_DATABASE_URL"
POOL_VARIABLE = "BENCH_FLOOR_POOL_SIZE"


def row_body(ref: int) -> dict[str, Any]:
    """A body of about 1 KB of JSON that names the row `ref` for the write's read."""
    return {
        "ref": ref,
        "kind": "floor",
        "labels": [f"label-{i}" for i in range(12)],
        "scores": {f"branch{i}": i / 7 for i in range(8)},
        "note": "lorem ipsum dolor sit amet " * 24,
    }


async def _init_connection(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )


async def _keep_session(connection: asyncpg.Connection) -> None:
    """What the pool does to a connection given back, beyond rolling back an open transaction:
    nothing. The routes change no session state (no SET, LISTEN, cursor or advisory lock), and
    asyncpg's default reset sends four statements (`RESET ALL`, ...) in a round trip on every
    release, a round trip the fastest path does not make: the service's pools do not make it."""


async def prepare(url: str, *, rows: int) -> None:
    """(Re)create the floor's table with `rows` rows, ids 1..rows, as the database's owner."""
    connection = await asyncpg.connect(url)
    try:
        await _init_connection(connection)
        await connection.execute(f"DROP TABLE IF EXISTS {TABLE}")
        await connection.execute(
            f"CREATE TABLE {TABLE} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " body jsonb NOT NULL)"
        )
        await connection.execute(
            f"INSERT INTO {TABLE} (body) SELECT jsonb_set($1::jsonb, '{{ref}}', to_jsonb(n))"
            " FROM generate_series(1, $2) AS n",
            row_body(0),
            rows,
        )
        await connection.execute(f"ANALYZE {TABLE}")
    finally:
        await connection.close()


def create_app(url: str | None = None) -> FastAPI:
    """The floor app on `url` (else the environment's, as uvicorn's workers build it), its pool
    opened by its lifespan."""
    url = url or os.environ[URL_VARIABLE]
    pool_size = int(os.environ.get(POOL_VARIABLE, "20"))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(
            url, min_size=1, max_size=pool_size, init=_init_connection, reset=_keep_session
        )
        app.state.pool = pool
        try:
            with serving_collector():
                yield
        finally:
            await pool.close()

    app = FastAPI(title="floor", lifespan=lifespan)

    @app.get("/floor/read/{row_id}")
    async def read(row_id: int, request: Request) -> dict[str, Any]:
        pool: asyncpg.Pool = request.app.state.pool
        async with pool.acquire() as connection:
            row = await connection.fetchrow(f"SELECT id, body FROM {TABLE} WHERE id = $1", row_id)
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND)
        return {"id": row["id"], "body": row["body"]}

    @app.post("/floor/write", status_code=status.HTTP_201_CREATED)
    async def write(body: dict[str, Any], request: Request) -> dict[str, Any]:
        pool: asyncpg.Pool = request.app.state.pool
        async with pool.acquire() as connection, connection.transaction():
            ref = await connection.fetchval(f"SELECT id FROM {TABLE} WHERE id = $1", body["ref"])
            if ref is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND)
            row_id = await connection.fetchval(
                f"INSERT INTO {TABLE} (body) VALUES ($1) RETURNING id", body
            )
        return {"id": row_id, "ref": ref}

    return app


def main(argv: list[str] | None = None) -> None:
    """Serve the floor as `grounding serve` serves the service."""
    import uvicorn

    from app.config import get_settings

    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--pool-size", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ[POOL_VARIABLE] = str(args.pool_size)
    uvicorn.run(
        "bench.floor:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        timeout_graceful_shutdown=get_settings().shutdown_timeout,
        log_level="info",
        access_log=False,
    )


if __name__ == "__main__":
    main()
