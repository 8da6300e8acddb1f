"""The application's lifespan."""

from __future__ import annotations

import gc

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
