"""Hand-read headers are documented, validated and refused as FastAPI does declared ones."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from app.access.auth import ACTING_TENANT_HEADER, ActingTenant
from app.headers import HandReadHeader, documenting
from app.idempotency.route import IDEMPOTENCY_KEY_HEADER, KeyHeader

HEADERS = [(ACTING_TENANT_HEADER, ActingTenant), (IDEMPOTENCY_KEY_HEADER, KeyHeader)]


def _twin_apps(header: HandReadHeader, declared: Any) -> FastAPI:
    """One app, a route declaring the header and one reading it by hand, each echoing it."""
    app = FastAPI()

    async def read_declared(value: Any = None) -> dict[str, Any]:
        return {"value": value}

    # Annotations are strings here (`from __future__ import annotations`): the parameter's own.
    read_declared.__annotations__["value"] = declared
    app.get("/declared")(read_declared)

    @app.get("/by-hand", openapi_extra=documenting(header))
    async def read_by_hand(request: Request) -> dict[str, Any]:
        return {"value": header.read(request)}

    return app


@pytest.mark.parametrize(("header", "declared"), HEADERS)
def test_a_hand_read_header_is_documented_as_a_declared_one(
    header: HandReadHeader, declared: Any
) -> None:
    paths = _twin_apps(header, declared).openapi()["paths"]
    assert paths["/by-hand"]["get"]["parameters"] == paths["/declared"]["get"]["parameters"]


@pytest.mark.parametrize(("header", "declared"), HEADERS)
@pytest.mark.parametrize(
    "given", [None, "ok-value", "", "x" * 129, "x" * 256, "tab\there", "caf\u00e9"]
)
async def test_a_hand_read_header_is_read_and_refused_as_a_declared_one(
    header: HandReadHeader, declared: Any, given: str | None
) -> None:
    transport = httpx.ASGITransport(app=_twin_apps(header, declared))
    sent = {} if given is None else {header.name.encode(): given.encode("latin-1")}
    async with httpx.AsyncClient(transport=transport, base_url="http://twins") as client:
        declared_answer = await client.get("/declared", headers=sent)
        hand_answer = await client.get("/by-hand", headers=sent)
    assert hand_answer.status_code == declared_answer.status_code
    assert hand_answer.json() == declared_answer.json()
