"""Count limits on a request body's lists, checked before the body is validated.

Validation reports every bad item of a list, so a long list of wrong values would cost time and
memory in proportion to its length (and a 422 that lists each one) before a check in the handler
could refuse it. A route names its limited lists with `limit_items`: each is counted in the JSON
as decoded (FastAPI decodes it before any dependency runs, and the request keeps it) and refused
with 413 `payload_too_large` before validation starts. Lists inside lists have fixed bounds in
their schemas instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, Request

from app.config import Settings, app_settings
from app.errors import enforce_limit


def limit_items(field: str, *, what: str, limit: Callable[[Settings], int]) -> Any:
    """A route dependency refusing a body whose list `field` holds more than `limit` items."""

    # The settings called for, not taken as `SettingsDep`: FastAPI solves a dependency's own
    # dependencies again on every request, cached or not.
    async def check(request: Request) -> None:
        settings = await app_settings(request)
        try:
            body = await request.json()
        except ValueError:
            return  # not JSON: validating the body says so
        items = body.get(field) if isinstance(body, dict) else None
        if isinstance(items, list):
            enforce_limit(what, len(items), limit(settings))

    return Depends(check)
