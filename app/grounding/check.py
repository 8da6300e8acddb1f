"""check_grounding: an answer against the citations its run issued. Fails closed.

Invariants kept here:
- every violation is found and reported; nothing is stripped, dropped or repaired, and the
  answer is never modified;
- the rejection's class is the first found in `VIOLATION_ORDER`;
- an answer passes only if every claim rests on at least one citation, every id it names is
  carried by the answer, and every carried citation is one the run issued, field for field;
- the work is linear in claims plus citations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from app.grounding.errors import VIOLATION_ORDER, GroundingError
from app.grounding.models import (
    PINNED_FIELDS,
    AnswerCitation,
    CitedAnswer,
    Claim,
    Issued,
    Violation,
    pinned_values,
)

Outcome = Literal["grounded", "refused"]


def find_violations(
    answer: CitedAnswer,
    issued: Sequence[Issued],
    *,
    tenant: str,
    cited_texts: Mapping[str, str] | None = None,
) -> list[Violation]:
    """Every rule `answer` breaks against the citations its run `issued` to `tenant`.

    `cited_texts` holds the pinned characters of issued citations by id; a quote is checked
    against them, and one whose citation's characters are not there (erased, or not given) fails.
    """
    issued_by_id = {citation.citation_id: citation for citation in issued}
    issued_ids = tuple(issued_by_id)
    carried_ids = tuple(citation.citation_id for citation in answer.citations)
    violations: list[Violation] = []
    seen: set[str] = set()
    for index, citation in enumerate(answer.citations):
        violations.extend(_citation_violations(index, citation, tenant, issued_by_id, issued_ids))
        if citation.citation_id in seen:
            violations.append(
                Violation(
                    violation_class="duplicate_citation_id",
                    citation=index,
                    citation_id=citation.citation_id,
                    detail="another citation in this answer has the same id",
                )
            )
        seen.add(citation.citation_id)
    if not answer.claims and not answer.refusal:
        violations.append(
            Violation(
                violation_class="uncited_claim",
                detail="an answer with no claims must be a refusal",
            )
        )
    carried = set(carried_ids)
    positions = {cid: i for i, cid in reversed(list(enumerate(carried_ids)))}
    for index, claim in enumerate(answer.claims):
        if not issued:
            violations.append(
                Violation(
                    violation_class="uncited_claim",
                    claim=index,
                    detail="the run retrieved nothing: only a refusal passes",
                )
            )
        if not claim.citation_ids:
            violations.append(
                Violation(
                    violation_class="uncited_claim",
                    claim=index,
                    detail="the claim rests on no citation",
                )
            )
        missing = tuple(dict.fromkeys(c for c in claim.citation_ids if c not in carried))
        if missing:
            violations.append(
                Violation(
                    violation_class="ungrounded_citation",
                    claim=index,
                    missing=missing,
                    available=carried_ids,
                    detail="the claim names citation ids the answer does not carry",
                )
            )
        violations.extend(_quote_violations(index, claim, cited_texts or {}, positions))
    return violations


def _quote_violations(
    index: int, claim: Claim, cited_texts: Mapping[str, str], positions: Mapping[str, int]
) -> list[Violation]:
    violations = []
    for quote in claim.quotes:
        if quote.citation_id not in claim.citation_ids:
            detail = "the quote names a citation the claim does not rest on"
        elif quote.text not in cited_texts.get(quote.citation_id, ""):
            detail = "the quoted words do not occur in the cited span"
        else:
            continue
        violations.append(
            Violation(
                violation_class="quote_mismatch",
                claim=index,
                citation=positions.get(quote.citation_id),
                citation_id=quote.citation_id,
                detail=detail,
            )
        )
    return violations


def _citation_violations(
    index: int,
    citation: AnswerCitation,
    tenant: str,
    issued_by_id: dict[str, Issued],
    issued_ids: tuple[str, ...],
) -> list[Violation]:
    if citation.tenant is not None and citation.tenant != tenant:
        return [
            Violation(
                violation_class="tenant_crossing",
                citation=index,
                citation_id=citation.citation_id,
                field="tenant",
                detail="the citation belongs to another tenant",
            )
        ]
    original = issued_by_id.get(citation.citation_id)
    if original is None:
        return [
            Violation(
                violation_class="ungrounded_citation",
                citation=index,
                citation_id=citation.citation_id,
                missing=(citation.citation_id,),
                available=issued_ids,
                detail="this run did not issue the citation",
            )
        ]
    repeated, pinned = pinned_values(citation), original.pinned
    # An answer that repeats every pinned field as issued (as agents do) is compared in one go.
    # Tuples take a value as equal to itself, unlike `!=`, only for NaN, which no pinned value
    # can be (`Finite`).
    differing = (
        []
        if repeated == pinned
        else [
            field
            for field, value, issued in zip(PINNED_FIELDS, repeated, pinned, strict=True)
            if value is not None and value != issued
        ]
    )
    if citation.span_sha256 is not None and original.span_sha256 not in (
        None,
        citation.span_sha256,
    ):
        differing.append("span_sha256")
    # Every differing field is a violation, but only the first says what was missing and
    # available: repeating the run's every id for each field could make a thousand citations
    # with a dozen fields changed twelve million ids long.
    return [
        Violation(
            violation_class="ungrounded_citation",
            citation=index,
            citation_id=citation.citation_id,
            field=field,
            missing=(citation.citation_id,) if n == 0 else None,
            available=issued_ids if n == 0 else None,
            detail=f"the citation's {field} is not what this run issued",
        )
        for n, field in enumerate(differing)
    ]


def rejection(violations: Sequence[Violation]) -> GroundingError | None:
    """The error an answer with these violations is rejected with, or None if there are none."""
    found = {violation.violation_class for violation in violations}
    for error_class in VIOLATION_ORDER:
        if error_class.code in found:
            count = len(violations)
            return error_class(
                f"the answer is not grounded: {count} violation{'s' if count != 1 else ''}",
                violations=[v.model_dump(by_alias=True, exclude_none=True) for v in violations],
            )
    return None


def check_grounding(
    answer: CitedAnswer,
    issued: Sequence[Issued],
    *,
    tenant: str,
    cited_texts: Mapping[str, str] | None = None,
) -> Outcome:
    """Raise the first failing class with every violation; otherwise say how the answer passed."""
    error = rejection(find_violations(answer, issued, tenant=tenant, cited_texts=cited_texts))
    if error is not None:
        raise error
    return "refused" if answer.refusal else "grounded"
