"""Connections handed out in turn: by the statement pool's slots and by the sessions' pool, a
connection given back goes to the first request still waiting for one, never to a later one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db import HandOffPool, HandOffQueue, create_engine, request_url
from app.errors import database_unreachable


async def test_items_go_to_their_waiters_in_turn_and_never_to_more_than_there_are() -> None:
    queue = HandOffQueue([None, None])
    order: list[int] = []

    async def hold(n: int) -> None:
        await queue.take(within=0.2)
        order.append(n)
        await asyncio.sleep(0.01)
        queue.give_back(None)

    holders = [asyncio.create_task(hold(n)) for n in range(2)]
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(hold(n)) for n in range(2, 6)]
    await asyncio.sleep(0)
    assert order == [0, 1]  # the waiters wait

    await asyncio.gather(*holders, *waiters)
    assert order == [0, 1, 2, 3, 4, 5]
    await _take_all(queue, 2)  # every item came back, and no more


async def _take_all(queue: HandOffQueue[None], count: int) -> None:
    for _ in range(count):
        await queue.take(within=0.05)
    with pytest.raises(PoolTimeoutError):
        await queue.take(within=0.05)


async def test_an_item_given_back_is_the_waiters_and_not_a_later_takers() -> None:
    queue = HandOffQueue(["a"])
    assert await queue.take(within=0.2) == "a"
    waiting = asyncio.create_task(queue.take(within=0.2))
    await asyncio.sleep(0)

    queue.give_back("a")
    # Asked for before the waiter runs again, as a request that just gave it back would.
    with pytest.raises(IndexError):
        queue.take_nowait()
    assert queue.free() == 0
    assert await waiting == "a"


async def test_free_items_are_taken_first_in_first_out_or_last_in_first_out() -> None:
    fifo, lifo = HandOffQueue([1, 2, 3]), HandOffQueue([1, 2, 3], lifo=True)

    assert [fifo.take_nowait() for _ in range(3)] == [1, 2, 3]
    assert [lifo.take_nowait() for _ in range(3)] == [3, 2, 1]


async def test_a_waiter_that_times_out_or_is_cancelled_takes_nothing() -> None:
    queue = HandOffQueue([None])
    await queue.take(within=0.05)
    with pytest.raises(PoolTimeoutError):
        await queue.take(within=0.05)
    cancelled = asyncio.create_task(queue.take(within=0.05))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    later = asyncio.create_task(queue.take(within=0.05))
    await asyncio.sleep(0)

    queue.give_back(None)  # to the one still waiting, past the two that left
    await later
    queue.give_back(None)
    await _take_all(queue, 1)


async def test_a_waiter_cancelled_as_it_is_handed_an_item_gives_it_back() -> None:
    queue = HandOffQueue([None])
    await queue.take(within=0.2)
    handed = asyncio.create_task(queue.take(within=0.2))
    next_in_turn = asyncio.create_task(queue.take(within=0.2))
    await asyncio.sleep(0)

    queue.give_back(None)
    handed.cancel()  # before it runs again to take what it was handed
    with pytest.raises(asyncio.CancelledError):
        await handed
    await next_in_turn
    queue.give_back(None)
    await _take_all(queue, 1)


@pytest.fixture
async def two_connections(settings: Settings) -> AsyncIterator[AsyncEngine]:
    """The service's own engine, with two connections for sessions and a short wait for one."""
    small = settings.model_copy(update={"db_max_connections": 2, "db_connect_timeout": 0.5})
    assert small.database_url is not None
    assert small.session_pool_size == 2
    engine = create_engine(small, request_url(small, small.database_url))
    assert isinstance(engine.pool, HandOffPool)
    yield engine
    await engine.dispose()


async def test_a_connection_given_back_goes_to_the_request_waiting_not_to_the_next(
    two_connections: AsyncEngine,
) -> None:
    engine = two_connections
    served: list[str] = []

    async def wait_for_one() -> None:
        async with engine.connect():
            served.append("waiting")

    first, second = await engine.connect(), await engine.connect()
    waiting = asyncio.create_task(wait_for_one())
    await asyncio.sleep(0.05)

    # The holder gives its connection back and at once asks for one again, with nothing in
    # between that lets the waiter run: as a busy worker's next request would.
    await first.close()
    async with engine.connect():
        served.append("next")
    await waiting
    await second.close()

    assert served == ["waiting", "next"]


async def test_under_a_steady_load_above_the_pool_no_request_waits_out_its_timeout(
    two_connections: AsyncEngine,
) -> None:
    engine = two_connections
    deadline = asyncio.get_running_loop().time() + 1.5
    served = 0

    async def client() -> None:
        # Each request asks for its connection as soon as the last one gave its back.
        nonlocal served
        while asyncio.get_running_loop().time() < deadline:
            connection = await engine.connect()
            await connection.exec_driver_sql("SELECT 1")
            await connection.close()  # as the request's transaction gives its connection back
            served += 1

    # Three clients over two connections, for three times the wait a request may have.
    await asyncio.gather(*(client() for _ in range(3)))

    assert served > 30


async def test_a_wait_past_the_timeout_is_a_database_unreachable_error(
    two_connections: AsyncEngine,
) -> None:
    engine = two_connections
    first, second = await engine.connect(), await engine.connect()
    try:
        with pytest.raises(PoolTimeoutError) as refused:
            await engine.connect()
        assert database_unreachable(refused.value)
    finally:
        await first.close()
        await second.close()
    # Both came back, and the request that timed out took neither.
    first, second = await engine.connect(), await engine.connect()
    await first.close()
    await second.close()
