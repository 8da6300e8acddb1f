"""Retrieval runs over HTTP."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from app.access.auth import ReaderKey
from app.bodies import json_response
from app.db import SessionDep
from app.idempotency.route import IdempotentRoute
from app.limits import limit_items
from app.runs import service as runs
from app.runs.schemas import RunCreate, RunRead
from app.runs.service import RecordedRun
from app.writes import WRITE_HEADERS, AgentWriteDep

router = APIRouter(prefix="/v1/runs", tags=["runs"], route_class=IdempotentRoute)


def _read(run: RecordedRun) -> RunRead:
    return RunRead(
        run_id=run.run_id,
        tenant=run.tenant,
        query=run.query,
        scope=run.scope,
        retrieved_at=run.retrieved_at,
        citations=run.citations,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=RunRead,
    openapi_extra=WRITE_HEADERS,
    dependencies=[
        limit_items("results", what="results per run", limit=lambda s: s.max_results_per_run)
    ],
)
async def record_run(
    body: RunCreate,
    request: Request,
    write: AgentWriteDep,
) -> Response:
    recorded = await runs.record_run(
        write.transaction,
        principal=write.principal,
        query=body.query,
        scope=body.scope,
        results=body.results,
    )
    request.app.state.metrics.citations_issued.inc(len(recorded["citations"]))
    return json_response(recorded, status_code=status.HTTP_201_CREATED)


@router.get("/{run_id}")
async def get_run(run_id: str, session: SessionDep, principal: ReaderKey) -> RunRead:
    return _read(await runs.get_run(session, tenant=principal.tenant, run_id=run_id))
