"""An agent's write in the request's transaction on the driver, as one route dependency.

The hot writes (a run, an answer's verification) take `AgentWriteDep`: the request's
transaction (`db.request_transaction`), the agent's key admitted in it, which scopes it to the
key's tenant, and the request's `Idempotency-Key` claimed in it, in that order, as three
dependencies and two header parameters would. One dependency reading its headers itself costs
FastAPI a third of what those five did: about 6% of a verification's CPU. The route documents
the headers with `WRITE_HEADERS` and keeps its response with `IdempotentRoute`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from app.access.auth import ACTING_TENANT_HEADER, admit_in_transaction
from app.access.service import Principal
from app.config import app_settings
from app.db import Transaction, request_transaction
from app.headers import documenting
from app.idempotency.route import IDEMPOTENCY_KEY_HEADER, claim

AGENT_SCOPES = frozenset({"agent"})


@dataclass(frozen=True, slots=True)
class AgentWrite:
    """The request's transaction and the principal whose key opened it."""

    transaction: Transaction
    principal: Principal


async def _agent_write(request: Request) -> AsyncIterator[AgentWrite]:
    async with request_transaction(request) as transaction:
        principal = await admit_in_transaction(request, transaction, AGENT_SCOPES)
        key = IDEMPOTENCY_KEY_HEADER.read(request)
        await claim(request, transaction, await app_settings(request), key)
        yield AgentWrite(transaction, principal)


AgentWriteDep = Annotated[AgentWrite, Depends(_agent_write, scope="function")]
# The route's `openapi_extra`: the headers `AgentWriteDep` reads.
WRITE_HEADERS: dict[str, Any] = documenting(ACTING_TENANT_HEADER, IDEMPOTENCY_KEY_HEADER)
