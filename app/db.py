"""The database: declarative base, engine, sessions, and the request's transaction.

The request owns the transaction, in a session (`get_session`) or, for the hot writes, on the
driver (`request_transaction`): it begins at the first statement, commits before the response is
sent and rolls back on any error, except a rejection that was recorded for audit, which commits
its record and is then answered as the rejection it is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Generic, Protocol, TypeVar

import asyncpg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from asyncpg import Record
from fastapi import Depends, Request
from sqlalchemy import MetaData, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.pool import AsyncAdaptedQueuePool, ConnectionPoolEntry, NullPool
from sqlalchemy.util.concurrency import await_
from sqlalchemy.util.queue import Empty, Full, QueueCommon

import migrations
from app.bodies import loads
from app.config import Settings
from app.errors import database_unreachable, keeps_work

T = TypeVar("T")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Base of every ORM table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Columns(Protocol):
    """A row's columns by name: a driver's record, or a SQLAlchemy row's mapping."""

    def __getitem__(self, column: str, /) -> Any: ...


def async_url(url: str) -> str:
    """A PostgreSQL URL with the asyncpg driver, whatever driver it named."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


# The role requests run as; created by the migrations, which run as the schema's owner.
APP_ROLE = "grounding_app"


def request_url(settings: Settings, owner_url: str) -> str:
    """The URL requests use: the configured one, or the owner's URL as `APP_ROLE`."""
    if settings.app_database_url:
        return settings.app_database_url
    as_app = make_url(owner_url).set(username=APP_ROLE, password=None)
    return as_app.render_as_string(hide_password=False)


def create_engine(settings: Settings, url: str) -> AsyncEngine:
    """The engine for one worker; bound parameters never appear in error messages."""
    return create_async_engine(
        async_url(url),
        poolclass=HandOffPool,
        pool_size=settings.session_pool_size,
        max_overflow=0,
        pool_timeout=settings.db_connect_timeout,
        # No ping on checkout: it costs three round trips a request. A connection that died
        # with the server fails its one request with a 503, and that invalidates the pool.
        hide_parameters=True,
        connect_args={"timeout": settings.db_connect_timeout},
        # jsonb columns (a citation's branches, a verification's claims) as `json` reads them.
        json_deserializer=loads,
    )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded objects usable after commit."""
    return async_sessionmaker(engine, expire_on_commit=False)


class _Unit(Protocol):
    """A request's transaction, in a session or on the driver."""

    def in_transaction(self) -> bool: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


@asynccontextmanager
async def _ends_with_request(unit: _Unit) -> AsyncIterator[None]:
    """Commit `unit` when the request's work is done; roll it back on any error, except a
    rejection that was recorded for audit, which commits its record first."""
    try:
        yield
    except BaseException as exc:
        if keeps_work(exc):
            await unit.commit()
        else:
            await unit.rollback()
        raise
    if unit.in_transaction():
        await unit.commit()


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One session and one transaction per request, committed before the response is sent."""
    sessionmaker: async_sessionmaker[AsyncSession] = request.app.state.sessionmaker
    async with sessionmaker() as session, _ends_with_request(session):
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]


class Statements(Protocol):
    """Where the statements of a request's transaction run: its session or the driver."""

    async def fetch(self, statement: str, *arguments: object) -> Sequence[Columns]:
        """The rows of `statement`, whose parameters are PostgreSQL's `$1`, `$2`, ..."""
        ...


class SessionStatements:
    """A session's transaction as `Statements`: each statement through SQLAlchemy, so the first
    begins the session's transaction as any other statement would."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def fetch(self, statement: str, *arguments: object) -> Sequence[Columns]:
        connection = await self.session.connection()
        result = await connection.exec_driver_sql(statement, arguments)
        return result.mappings().all() if result.returns_rows else []


class Transaction:
    """The request's transaction on the driver: a connection of the engine's pool, and `BEGIN`,
    each statement and the end all the driver's, with none of a session's or SQLAlchemy's
    per-statement work. It begins at its first statement, so what that statement sets for the
    transaction (`app.tenant`) holds for every later one.

    It ends once, committed or rolled back; a connection whose `BEGIN` or end did not complete
    is closed rather than given back to the pool. Given a connection already in a transaction
    instead of an engine (an app whose sessions join one), it is a savepoint of that
    transaction, as those sessions are.
    """

    def __init__(self, bind: AsyncEngine | AsyncConnection) -> None:
        self._bind = bind
        self._held: tuple[AsyncConnection, asyncpg.Connection] | None = None
        self._ended = False

    def in_transaction(self) -> bool:
        return self._held is not None

    async def fetch(self, statement: str, *arguments: object) -> list[Record]:
        """The rows of `statement`, prepared and run by the driver in this transaction."""
        connection, driver = self._held or await self._begin()
        rows: list[Record] = await _on_driver(
            connection, driver, statement, lambda: driver.fetch(statement, *arguments)
        )
        return rows

    async def commit(self) -> None:
        await self._end(commit=True)

    async def rollback(self) -> None:
        await self._end(commit=False)

    async def _begin(self) -> tuple[AsyncConnection, asyncpg.Connection]:
        if self._ended:
            raise RuntimeError("the request's transaction has ended")
        if isinstance(self._bind, AsyncConnection):
            driver = await _driver(self._bind)
            await _execute(self._bind, driver, "SAVEPOINT request")
            self._held = self._bind, driver
            return self._held
        connection = await self._bind.connect()
        try:
            driver = await _driver(connection)
            await _execute(connection, driver, "BEGIN")
        except BaseException:
            await _give_back(connection, clean=False)
            raise
        self._held = connection, driver
        return self._held

    async def _end(self, *, commit: bool) -> None:
        held, self._held, self._ended = self._held, None, True
        if held is None:
            return
        connection, driver = held
        if connection is self._bind:
            savepoint = "RELEASE SAVEPOINT request" if commit else "ROLLBACK TO SAVEPOINT request"
            await _execute(connection, driver, savepoint)
            return
        if connection.invalidated:
            # Lost with a statement, which failed as unreachable: the server ended the
            # transaction, and nothing of it was kept.
            await connection.close()
            if commit:
                raise OperationalError(
                    "COMMIT",
                    None,
                    ConnectionError("the connection was lost before the commit"),
                    hide_parameters=True,
                    connection_invalidated=True,
                )
            return
        clean = False
        try:
            await _execute(connection, driver, "COMMIT" if commit else "ROLLBACK")
            clean = True
        finally:
            await _give_back(connection, clean=clean)


async def _give_back(connection: AsyncConnection, *, clean: bool) -> None:
    """Return `connection` to its pool; one whose statement did not end cleanly (failed, cut off,
    cancelled) may still be in a transaction, and is closed instead."""
    if not clean and not connection.invalidated:
        await connection.invalidate()
    await connection.close()


@asynccontextmanager
async def request_transaction(request: Request) -> AsyncIterator[Transaction]:
    """The request's transaction on the driver, to commit when the request's work is done."""
    sessionmaker: async_sessionmaker[AsyncSession] = request.app.state.sessionmaker
    transaction = Transaction(sessionmaker.kw["bind"])
    async with _ends_with_request(transaction):
        yield transaction


async def scope_to_tenant(session: AsyncSession, tenant: str) -> None:
    """Scope the rest of this transaction to `tenant` (row-level security reads this setting)."""
    await session.execute(
        text("SELECT set_config('app.tenant', :tenant, true)"), {"tenant": tenant}
    )


async def fetch(session: AsyncSession, statement: str, *arguments: object) -> list[Record]:
    """The rows of `statement`, a prepared statement run by the driver itself: none of
    SQLAlchemy's per-statement work, for the hot reads.

    It runs in the session's transaction once one has begun (a statement through SQLAlchemy
    begins it). Before that, it is a transaction of its own, on a connection of the session's
    engine. Its errors are SQLAlchemy's, as every other statement's are: a lost connection is
    invalidated and answered 503.
    """
    bind = session.bind
    if isinstance(bind, AsyncEngine) and not session.in_transaction():
        async with bind.connect() as connection:
            return await _fetch(connection, statement, arguments)
    return await _fetch(await session.connection(), statement, arguments)


async def read(request: Request, statement: str, *arguments: object) -> list[Record]:
    """The rows of a read that is its request's one statement: on the app's `StatementPool`;
    where it has none (a connection budget under four, or an app given its sessionmaker rather
    than its lifespan's), in a session of its own."""
    statements: StatementPool | None = request.app.state.statements
    if statements is not None:
        return await statements.fetch(statement, *arguments)
    sessionmaker: async_sessionmaker[AsyncSession] = request.app.state.sessionmaker
    async with sessionmaker() as session:
        return await fetch(session, statement, *arguments)


async def _driver(connection: AsyncConnection) -> asyncpg.Connection:
    driver: asyncpg.Connection | None = (await connection.get_raw_connection()).driver_connection
    assert driver is not None
    return driver


async def _fetch(
    connection: AsyncConnection, statement: str, arguments: tuple[object, ...]
) -> list[Record]:
    driver = await _driver(connection)
    rows: list[Record] = await _on_driver(
        connection, driver, statement, lambda: driver.fetch(statement, *arguments)
    )
    return rows


async def _execute(connection: AsyncConnection, driver: asyncpg.Connection, statement: str) -> None:
    """Run `statement` (no parameters, no rows: `BEGIN`, `COMMIT`) on the driver."""
    await _on_driver(connection, driver, statement, lambda: driver.execute(statement))


async def _on_driver(
    connection: AsyncConnection,
    driver: asyncpg.Connection,
    statement: str,
    run: Callable[[], Awaitable[T]],
) -> T:
    """What `run` (`statement` on `driver`) returns; its failure as SQLAlchemy's, as every
    other statement's is: a lost connection is invalidated and answered 503."""
    try:
        return await run()
    except _DRIVER_ERRORS as error:
        failure = _failure(statement, error, lost=driver.is_closed())
        if failure.connection_invalidated:
            await connection.invalidate(error)
        raise failure from error


# What the driver raises when a statement fails or its connection does.
_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


def _failure(statement: str, error: BaseException, *, lost: bool) -> DBAPIError:
    """A driver's error as SQLAlchemy's, as `app.errors` maps every database failure: one that
    lost the connection (or could not make one) is an `OperationalError`, answered 503."""
    failure = DBAPIError(statement, None, error, hide_parameters=True)
    if lost or isinstance(error, OSError | TimeoutError) or database_unreachable(failure):
        return OperationalError(
            statement,
            None,
            error,
            hide_parameters=True,
            connection_invalidated=True,
        )
    return failure


class HandOffQueue(Generic[T]):
    """Items lent in turn: one given back goes to the first taker still waiting for one, and a
    taker waits only while none is free. A wait longer than the taker allows (`within`) is a
    `PoolTimeoutError`, as a session's wait for a connection is.

    `asyncio.Queue` is not fair: an item put back wakes its first waiter, but whoever asks
    before that waiter runs again takes the item, and the waiter goes to the back of the line.
    Under a steady load above the pool's size, a request could wait out its whole timeout while
    later ones were served. Here the item is the waiter's from the moment it is given back.

    A wait under `asyncio.timeout` costs 12 us, which most takers pay under load; a timer on the
    waiter's own future costs 4.
    """

    def __init__(self, items: Iterable[T] = (), *, lifo: bool = False) -> None:
        self._free: deque[T] = deque(items)
        self._next = self._free.pop if lifo else self._free.popleft
        # Every waiter came while none was free: an item given back goes to the first of them.
        self._waiters: deque[asyncio.Future[T]] = deque()

    def free(self) -> int:
        """How many items are free to take now."""
        return len(self._free)

    def take_nowait(self) -> T:
        """A free item; `IndexError` when none is free."""
        return self._next()

    async def take(self, *, within: float | None) -> T:
        """An item, waiting up to `within` seconds (None: for as long as it takes) for one if
        none is free."""
        if self._free:
            return self._next()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(within, _expire, waiter) if within is not None else None
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give_back(waiter.result())  # handed one just as it was cancelled: unused
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def give_back(self, item: T) -> None:
        """Hand `item` to the first waiter still waiting, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # one that timed out or was cancelled is done
                waiter.set_result(item)
                return
        self._free.append(item)


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(PoolTimeoutError("no database connection was free in time"))


class _HandOffPoolQueue(QueueCommon[ConnectionPoolEntry]):
    """SQLAlchemy's pool queue as a `HandOffQueue`: the pool's connections in turn."""

    def __init__(self, maxsize: int = 0, use_lifo: bool = False) -> None:
        self.maxsize = maxsize
        self.use_lifo = use_lifo
        self._queue: HandOffQueue[ConnectionPoolEntry] = HandOffQueue(lifo=use_lifo)

    def empty(self) -> bool:
        return not self._queue.free()

    def full(self) -> bool:
        return 0 < self.maxsize <= self._queue.free()

    def qsize(self) -> int:
        return self._queue.free()

    def put_nowait(self, item: ConnectionPoolEntry) -> None:
        if self.full():
            raise Full()
        self._queue.give_back(item)

    def put(
        self, item: ConnectionPoolEntry, block: bool = True, timeout: float | None = None
    ) -> None:
        self.put_nowait(item)  # a connection comes back at once or not at all

    def get_nowait(self) -> ConnectionPoolEntry:
        try:
            return self._queue.take_nowait()
        except IndexError:
            raise Empty() from None

    def get(self, block: bool = True, timeout: float | None = None) -> ConnectionPoolEntry:
        if not block:
            return self.get_nowait()
        try:
            return await_(self._queue.take(within=timeout))
        except PoolTimeoutError:
            raise Empty() from None


class HandOffPool(AsyncAdaptedQueuePool):
    """SQLAlchemy's pool for asyncio, with its connections handed out in turn (`HandOffQueue`)
    rather than to whoever asks first once one comes back."""

    _queue_class = _HandOffPoolQueue


class StatementPool:
    """Connections lent to reads that are their request's one statement, for that statement
    alone: no session, no transaction block, no SQLAlchemy pool around it, whose work on such a
    read costs more than the read's own.

    A lent connection comes back as it went: the statement is its own transaction, and what it
    sets (`app.tenant`) is local to that transaction. One whose statement did not end cleanly
    (lost, cut off, cancelled) is closed instead; one that lost its server closes the idle ones
    too, as they lost it as well. At most `size` are open; a read waits up to `timeout` seconds
    for one, as it would for a session's connection, and that wait is a 503 as that one is.

    Its statements are planned once a connection (a generic plan), not on every run. They look
    rows up by primary key, from a tenant the statement itself reads off the key's row, so no
    parameter's value would change their plan; yet the server, left to choose, plans each run
    anew (its estimate of a custom plan stays under the generic one's), and planning their
    joins under row-level security took it nearly twice as long as running them did.
    """

    def __init__(self, connect_arguments: dict[str, Any], *, size: int, timeout: float) -> None:
        settings = connect_arguments.get("server_settings") or {}
        self._connect_arguments = connect_arguments | {
            "timeout": timeout,
            "server_settings": settings | {"plan_cache_mode": "force_generic_plan"},
        }
        self._timeout = timeout
        self._slots: HandOffQueue[None] = HandOffQueue([None] * size)
        self._idle: list[asyncpg.Connection] = []
        self._closed = False

    @classmethod
    def for_engine(cls, engine: AsyncEngine, *, size: int, timeout: float) -> StatementPool:
        """A pool reaching the server as `engine` does, with its dialect's connection arguments."""
        _, arguments = engine.dialect.create_connect_args(engine.url)
        return cls(dict(arguments), size=size, timeout=timeout)

    async def fetch(self, statement: str, *arguments: object) -> list[Record]:
        """The rows of `statement`, prepared and run by the driver on a lent connection."""
        await self._slots.take(within=self._timeout)
        connection: asyncpg.Connection | None = None
        try:
            connection = self._idle.pop() if self._idle else await self._connect()
            rows: list[Record] = await connection.fetch(statement, *arguments)
        except BaseException as error:
            lost = connection is None or connection.is_closed()
            if connection is not None:
                self._give_back(connection, clean=isinstance(error, asyncpg.PostgresError))
            if not isinstance(error, _DRIVER_ERRORS):
                raise
            failure = _failure(statement, error, lost=lost)
            if failure.connection_invalidated:
                self._close_idle()
            raise failure from error
        finally:
            self._slots.give_back(None)
        self._give_back(connection, clean=True)
        return rows

    async def close(self) -> None:
        """Close the idle connections, and any lent one as it comes back."""
        self._closed = True
        idle, self._idle = self._idle, []
        closing = (connection.close(timeout=self._timeout) for connection in idle)
        await asyncio.gather(*closing, return_exceptions=True)

    async def _connect(self) -> asyncpg.Connection:
        connection: asyncpg.Connection = await asyncpg.connect(**self._connect_arguments)
        return connection

    def _give_back(self, connection: asyncpg.Connection, *, clean: bool) -> None:
        if clean and not self._closed and not connection.is_closed():
            self._idle.append(connection)
        else:
            connection.terminate()

    def _close_idle(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.terminate()


def alembic_config(url: str) -> Config:
    """Alembic's configuration for the migrations shipped with the package, against `url`."""
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.attributes["url"] = url
    return config


def migrate(url: str, *, app_password: str | None = None) -> None:
    """Apply every migration to `url` (concurrent callers take turns on an advisory lock), and
    give `APP_ROLE` its password when requests reach the server with one."""
    command.upgrade(alembic_config(url), "head")
    if app_password:
        asyncio.run(_set_app_password(url, app_password))


def app_password(settings: Settings) -> str | None:
    """The password in `GROUNDING_APP_DATABASE_URL`, which `APP_ROLE` must then have."""
    if not settings.app_database_url:
        return None
    password = make_url(settings.app_database_url).password
    return str(password) if password is not None else None


async def _set_app_password(url: str, password: str) -> None:
    engine = create_async_engine(async_url(url), poolclass=NullPool, hide_parameters=True)
    try:
        async with engine.begin() as connection:
            statement = await connection.scalar(
                text(
                    "SELECT format('ALTER ROLE %I PASSWORD %L',"
                    " CAST(:role AS text), CAST(:password AS text))"
                ),
                {"role": APP_ROLE, "password": password},
            )
            await connection.exec_driver_sql(statement)
    finally:
        await engine.dispose()


def head_revision() -> str:
    """The revision the shipped migrations end at."""
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None
    return head


async def current_revision(session: AsyncSession) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    exists = (await session.execute(text("SELECT to_regclass('alembic_version')"))).scalar()
    if exists is None:
        return None
    return (await session.execute(text("SELECT version_num FROM alembic_version"))).scalar()
