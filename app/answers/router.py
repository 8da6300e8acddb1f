"""Answer verification over HTTP: 200 when grounded or refused, 422 problem when rejected."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.access.auth import ReaderKey
from app.answers import service as answers
from app.answers.schemas import ClaimRead, VerificationPassed, VerificationRead
from app.db import SessionDep
from app.grounding.models import CitedAnswer, prose
from app.idempotency.route import IdempotentRoute
from app.limits import limit_items
from app.writes import WRITE_HEADERS, AgentWriteDep

router = APIRouter(tags=["answers"], route_class=IdempotentRoute)


@router.post(
    "/v1/runs/{run_id}/answers",
    openapi_extra=WRITE_HEADERS,
    dependencies=[
        limit_items("claims", what="claims per answer", limit=lambda s: s.max_claims_per_answer),
        limit_items(
            "citations", what="citations per answer", limit=lambda s: s.max_citations_per_answer
        ),
    ],
)
async def verify_answer(
    run_id: str,
    body: CitedAnswer,
    request: Request,
    write: AgentWriteDep,
) -> VerificationPassed:
    verification = await answers.verify_answer(
        write.transaction, principal=write.principal, run_id=run_id, answer=body
    )
    # A rejection raises, and is counted where it is answered (app.errors).
    request.app.state.metrics.verifications.labels(outcome=verification.outcome, code="").inc()
    return VerificationPassed(
        verification_id=verification.verification_id,
        run_id=run_id,
        outcome="refused" if body.refusal else "grounded",
        text=body.text,
        claims=list(body.claims),
        provenance=verification.provenance,
        created_at=verification.created_at,
    )


@router.get("/v1/answers/{verification_id}")
async def get_verification(
    verification_id: str, session: SessionDep, principal: ReaderKey
) -> VerificationRead:
    found = await answers.get_verification(
        session, tenant=principal.tenant, verification_id=verification_id
    )
    v = found.verification
    claims = [
        ClaimRead(
            text=claim["text"],
            citation_ids=claim["citation_ids"],
            sources=[found.sources[cid] for cid in claim["citation_ids"] if cid in found.sources],
        )
        for claim in v.claims
    ]
    return VerificationRead(
        verification_id=v.verification_id,
        run_id=v.run_id,
        tenant=v.tenant,
        key_id=v.key_id,
        outcome=v.outcome,
        code=v.code,
        violations=v.violations,
        text=prose(claim.text for claim in claims),
        claims=claims,
        provenance=v.provenance,
        claim_count=v.claim_count,
        citation_count=v.citation_count,
        answer_sha256=v.answer_sha256,
        created_at=v.created_at,
    )
