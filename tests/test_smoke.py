from __future__ import annotations

import httpx

from tests.factories import Keys, record_run, register_version


async def test_register_and_cite(client: httpx.AsyncClient, keys: Keys) -> None:
    await register_version(client, keys)
    run = await record_run(client, keys)
    assert len(run["citations"]) == 4
