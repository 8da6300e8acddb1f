"""check_grounding as a service: an answer verified against its stored run, every attempt recorded.

Invariants kept here:
- the answer is checked against the citations the run issued, loaded with the run in one
  statement, and it is rejected, never repaired;
- every attempt, grounded, refused or rejected, is recorded in the request's transaction, and a
  rejection is raised only after its record is written (it commits with it);
- the record keeps claims and citation ids, never copies of the submitted citations;
- the run and its citations are read in one statement and the attempt is written in one more
  (two more when it quotes), whatever the size of the answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from asyncpg import Record
from sqlalchemy.ext.asyncio import AsyncSession

from app import telemetry
from app.access.service import Principal
from app.audit import chain
from app.audit import service as audit
from app.citations import service as citations
from app.db import Transaction
from app.errors import NotFound
from app.grounding.check import find_violations, rejection
from app.grounding.errors import GroundingError
from app.grounding.excerpt import citation_attributes
from app.grounding.models import Citation, CitedAnswer, IssuedPin
from app.ids import new_id
from app.models import Verification


@dataclass(frozen=True, slots=True)
class Passed:
    """A grounded or refused answer's verification, as recorded."""

    verification_id: str
    outcome: str
    provenance: list[str]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class VerifiedAnswer:
    """A recorded verification with the issued citations its claims name."""

    verification: Verification
    sources: dict[str, Citation]


def answer_sha256(answer: CitedAnswer) -> str:
    """sha256 of the answer's canonical JSON, quotes and span hashes left out."""
    dumped = answer.model_dump(mode="json")
    # Corpus text and its plain hashes are left out: kept past an erasure, a plain hash of a
    # short quote or span could confirm a guess of the erased words. Removed from the dump,
    # which is a third cheaper than pydantic's nested `exclude`.
    for claim in dumped["claims"]:
        del claim["quotes"]
    for citation in dumped["citations"]:
        del citation["span_sha256"]
    return hashlib.sha256(chain.canonical(dumped)).hexdigest()


# The run's citations in result order, each as the check reads it (`_issued_pin` unpacks the
# columns in this order); one row of nulls when it issued none, and no row at all when there is
# no such run. Every statement of a verification is the driver's, in the request's transaction
# on it: SQLAlchemy's per-statement and per-row work costs more than their round trips.
_ISSUED = """
    SELECT c.citation_id, c.document_id, c.document_version, c.run_id, c.chunk_id,
           c.span_start, c.span_end, c.utf8_start, c.utf8_end, c.utf16_start, c.utf16_end,
           c.score, c.branches, c.retrieved_at, c.uri, c.page, c.section, c.span_sha256
      FROM runs r
      LEFT JOIN citations c ON c.tenant = r.tenant AND c.run_id = r.run_id
     WHERE r.tenant = $1 AND r.run_id = $2
     ORDER BY c.ordinal
    """


def _issued_pin(row: Record) -> IssuedPin:
    """A row of `_ISSUED` as the check reads its citation: what `pinned_values` gives of the
    `Citation` `citations.from_row` would build, for under a tenth of what building it costs."""
    (
        citation_id,
        document_id,
        document_version,
        run_id,
        chunk_id,
        start,
        end,
        utf8_start,
        utf8_end,
        utf16_start,
        utf16_end,
        score,
        branches,
        retrieved_at,
        uri,
        page,
        section,
        span_sha256,
    ) = row
    pinned = (
        document_id,
        document_version,
        run_id,
        chunk_id,
        (start, end),
        (utf8_start, utf8_end),
        (utf16_start, utf16_end),
        score,
        branches,
        retrieved_at,
        (uri, page, section),
    )
    return IssuedPin(citation_id, document_id, document_version, pinned, span_sha256)


async def _issued(transaction: Transaction, tenant: str, run_id: str) -> list[IssuedPin]:
    rows = await transaction.fetch(_ISSUED, tenant, run_id)
    if not rows:
        raise NotFound("no such run")
    return [_issued_pin(row) for row in rows if row[0] is not None]


# The text of the chunks the run's citations among $3 pin; an erased version's chunks have none.
_CITED_TEXTS = """
    SELECT c.citation_id, ch.text
      FROM citations c
      JOIN chunks ch
        ON ch.tenant = c.tenant AND ch.document_id = c.document_id
       AND ch.version = c.document_version AND ch.chunk_id = c.chunk_id
     WHERE c.tenant = $1 AND c.run_id = $2 AND c.citation_id = ANY($3::text[])
       AND ch.text IS NOT NULL
    """


async def _cited_texts(
    transaction: Transaction, tenant: str, run_id: str, citation_ids: set[str]
) -> dict[str, str]:
    rows = await transaction.fetch(_CITED_TEXTS, tenant, run_id, sorted(citation_ids))
    return dict(rows)


def _span_attributes(
    answer: CitedAnswer, issued: list[IssuedPin], outcome: str, error: GroundingError | None
) -> telemetry.Attributes:
    # The run's own citations the answer carries, not the answer's copies of them: their
    # document ids and versions are the registry's, never whatever a caller typed.
    carried = {c.citation_id for c in answer.citations}
    return {
        **citation_attributes(c for c in issued if c.citation_id in carried),
        "adk.grounding.claim_count": len(answer.claims),
        "adk.grounding.answer_citation_count": len(answer.citations),
        "adk.grounding.outcome": outcome,
        "adk.grounding.violation_count": len(error.violations) if error else 0,
        **({"adk.grounding.code": error.code} if error else {}),
    }


# The verification, the citation ids it rests on and its audit entry in one statement: one round
# trip, whatever the size of the answer. Parameters in `_RECORDED` order, then the audit
# entry's content hash.
_RECORD = """
    WITH verification AS (
      INSERT INTO verifications (tenant, verification_id, run_id, key_id, outcome, code,
                                 violations, claims, provenance, claim_count, citation_count,
                                 answer_sha256, created_at)
      VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8::text::jsonb, $9::text[], $10, $11,
              $12, $13)
    ), sources AS (
      INSERT INTO verification_citations (tenant, verification_id, citation_id)
      SELECT $1, $2, citation_id FROM unnest($9::text[]) AS citation_id
    )
    """ + audit.entry_insert(
    tenant="$1", kind="'verification'", record_id="$2", content_sha256="$14"
)
_RECORDED = ("tenant", *audit.VERIFICATION_FIELDS)


@telemetry.traced("grounding.check")
async def verify_answer(
    transaction: Transaction, *, principal: Principal, run_id: str, answer: CitedAnswer
) -> Passed:
    """Check `answer` against run `run_id`, record the attempt, and raise if it is rejected."""
    issued = await _issued(transaction, principal.tenant, run_id)
    quoted = {quote.citation_id for claim in answer.claims for quote in claim.quotes}
    # Quotes need the cited characters: one more statement, only when there are quotes.
    cited_texts = (
        await _cited_texts(transaction, principal.tenant, run_id, quoted) if quoted else {}
    )
    violations = find_violations(answer, issued, tenant=principal.tenant, cited_texts=cited_texts)
    error = rejection(violations)
    if error is not None:
        outcome, code = "rejected", error.code
    else:
        outcome, code = ("refused" if answer.refusal else "grounded"), None
    telemetry.annotate(lambda: _span_attributes(answer, issued, outcome, error))
    verification_id = new_id("ver")
    provenance = answer.provenance()
    values: dict[str, Any] = {
        "tenant": principal.tenant,
        "verification_id": verification_id,
        "run_id": run_id,
        "key_id": principal.key_id,
        "outcome": outcome,
        "code": code,
        "violations": error.violations if error is not None else [],
        # Quoted words are corpus text, which erasure must be able to remove: not kept here.
        "claims": [
            {"text": claim.text, "citation_ids": list(claim.citation_ids)}
            for claim in answer.claims
        ],
        "provenance": provenance,
        "claim_count": len(answer.claims),
        "citation_count": len(answer.citations),
        "answer_sha256": answer_sha256(answer),
        "created_at": datetime.now(UTC),
    }
    recorded = {
        **values,
        "violations": json.dumps(values["violations"]),
        "claims": json.dumps(values["claims"]),
    }
    await transaction.fetch(
        _RECORD,
        *(recorded[name] for name in _RECORDED),
        chain.content_sha256(audit.verification_content(values)),
    )
    if error is not None:
        error.verification_id = verification_id
        raise error
    # Not an ORM object: the record is written already, and building one costs 16 us.
    return Passed(verification_id, outcome, provenance, values["created_at"])


async def find_verification(
    session: AsyncSession, *, tenant: str, verification_id: str
) -> Verification | None:
    """A recorded verification of `tenant`, or None."""
    return await session.get(Verification, (tenant, verification_id))


async def get_verification(
    session: AsyncSession, *, tenant: str, verification_id: str
) -> VerifiedAnswer:
    """A recorded verification with the issued citations its claims name, or `NotFound`."""
    verification = await find_verification(session, tenant=tenant, verification_id=verification_id)
    if verification is None:
        raise NotFound("no such verification")
    named = {cid for claim in verification.claims for cid in claim["citation_ids"]}
    run_sources = await citations.find_citations(session, tenant=tenant, citation_ids=named)
    sources = {cid: c for cid, c in run_sources.items() if c.run_id == verification.run_id}
    return VerifiedAnswer(verification=verification, sources=sources)
