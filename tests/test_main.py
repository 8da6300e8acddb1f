"""The application's lifespan."""

from __future__ import annotations

import gc
import re

import httpx
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from app.collector import YOUNG_COLLECTION_THRESHOLD
from app.config import Settings
from app.main import create_app


async def test_startup_freezes_what_it_made_so_no_collection_walks_it_again(
    settings: Settings,
) -> None:
    app = create_app(settings)
    gc.unfreeze()
    try:
        async with app.router.lifespan_context(app):
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


async def test_young_objects_are_collected_less_often_while_it_serves(
    settings: Settings,
) -> None:
    app = create_app(settings)
    original = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        async with app.router.lifespan_context(app):
            assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*original)
        gc.unfreeze()


async def test_every_route_is_reached_by_its_own_path(app: FastAPI) -> None:
    # The routers are ordered by how often they are called: no route may shadow another's path.
    reached: dict[str, str] = {}

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        await app(scope, receive, send)
        reached[f"{scope['method']} {scope['path']}"] = scope["route"].name

    operations = [
        (method.upper(), re.sub(r"\{[^}]+\}", "x1", path), operation["operationId"])
        for path, item in app.openapi()["paths"].items()
        for method, operation in item.items()
    ]
    transport = httpx.ASGITransport(app=recording)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for method, path, _ in operations:
            await client.request(method, path)
    assert reached == {f"{method} {path}": name for method, path, name in operations}
