"""The application's lifespan."""

from __future__ import annotations

import gc

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
