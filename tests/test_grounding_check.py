"""check_grounding and the answer model, without a database: examples and properties."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.grounding import (
    AnswerCitation,
    Citation,
    CitedAnswer,
    Claim,
    DuplicateCitationIdError,
    GroundingError,
    Locator,
    Span,
    TenantCrossingError,
    UncitedClaimError,
    UngroundedCitationError,
    Violation,
    check_grounding,
    find_violations,
    rejection,
)
from app.grounding.errors import ERRORS_BY_CODE, VIOLATION_ORDER
from app.grounding.models import PINNED_FIELDS, pinned_values

TENANT = "acme"
RUN = "run_1"
RETRIEVED_AT = datetime(2026, 11, 3, 9, 30, tzinfo=UTC)
# quote_mismatch (quotes that do not occur in the cited span) is ordered after ungrounded_citation.
ORDER = (
    "tenant_crossing",
    "duplicate_citation_id",
    "ungrounded_citation",
    "quote_mismatch",
    "uncited_claim",
)


def issued_citation(
    index: int, *, start: int = 0, length: int = 10, document_id: str = "refund-policy"
) -> Citation:
    """A citation as `cite` would issue it for run RUN of TENANT."""
    return Citation(
        citation_id=f"cit_{index}",
        run_id=RUN,
        tenant=TENANT,
        document_id=document_id,
        document_version="2026-11-03",
        chunk_id=f"c{index}",
        span=Span(start=start, end=start + length),
        score=0.5,
        branches={"bm25": 1.5, "vector": 0.7},
        retrieved_at=RETRIEVED_AT,
        locator=Locator(uri="https://handbook/refunds", page=index, section=f"S{index}"),
        span_sha256=f"{index:064x}",
        span_utf8=Span(start=start, end=start + length + 2),
        span_utf16=Span(start=start, end=start + length + 1),
    )


def as_carried(citation: Citation, *, shape: str = "full") -> AnswerCitation:
    """The citation as an answer carries it: every issued field, the essentials, or plus tenant."""
    if shape == "full":
        return AnswerCitation.model_validate(citation.model_dump())
    essentials = {
        "citation_id": citation.citation_id,
        "document_id": citation.document_id,
        "document_version": citation.document_version,
    }
    if shape == "with_tenant":
        essentials["tenant"] = citation.tenant
    return AnswerCitation.model_validate(essentials)


def summary(violations: list[Violation]) -> list[dict[str, Any]]:
    """The violations as the problem body lists them, without the prose `detail`."""
    return [v.model_dump(by_alias=True, exclude_none=True, exclude={"detail"}) for v in violations]


def classes(violations: list[Violation]) -> list[str]:
    return [v.violation_class for v in violations]


def naive_provenance(answer: CitedAnswer) -> list[str]:
    seen: list[str] = []
    for claim in answer.claims:
        for cid in claim.citation_ids:
            if cid not in seen:
                seen.append(cid)
    return seen


# ---------------------------------------------------------------------------------------------
# Strategies


@st.composite
def issued_runs(draw: st.DrawFn, *, min_size: int = 1) -> list[Citation]:
    """Citations one run issued to TENANT: unique ids, random documents, versions and spans."""
    size = draw(st.integers(min_value=min_size, max_value=6))
    citations = []
    for index in range(size):
        start = draw(st.integers(min_value=0, max_value=10_000))
        length = draw(st.integers(min_value=1, max_value=500))
        extra8 = draw(st.integers(min_value=0, max_value=3 * length))
        extra16 = draw(st.integers(min_value=0, max_value=length))
        citations.append(
            Citation(
                citation_id=f"cit_{index}",
                run_id=RUN,
                tenant=TENANT,
                document_id=draw(st.sampled_from(["refund-policy", "shipping", "返金"])),
                document_version=draw(st.sampled_from(["2026-11-03", "v2", "v3"])),
                chunk_id=f"c{draw(st.integers(min_value=0, max_value=99))}",
                span=Span(start=start, end=start + length),
                score=draw(st.none() | st.floats(min_value=0, max_value=1)),
                branches=draw(
                    st.dictionaries(
                        st.sampled_from(["bm25", "vector", "rerank"]),
                        st.floats(min_value=0, max_value=50),
                    )
                ),
                retrieved_at=RETRIEVED_AT,
                locator=Locator(
                    uri=draw(st.none() | st.just("https://handbook/x")),
                    page=draw(st.none() | st.integers(min_value=1, max_value=40)),
                    section=draw(st.none() | st.just("Scope")),
                ),
                span_sha256=f"{index:064x}",
                span_utf8=Span(start=start, end=start + length + extra8),
                span_utf16=Span(start=start, end=start + length + extra16),
            )
        )
    return citations


@st.composite
def grounded_answers(draw: st.DrawFn, *, min_claims: int = 1) -> tuple[CitedAnswer, list[Citation]]:
    """An answer that carries some of its run's citations and whose claims cite only those."""
    issued = draw(issued_runs())
    picked = draw(
        st.lists(st.sampled_from(range(len(issued))), min_size=1, max_size=len(issued), unique=True)
    )
    carried = [issued[i] for i in picked]
    shapes = draw(
        st.lists(
            st.sampled_from(["full", "essentials", "with_tenant"]),
            min_size=len(carried),
            max_size=len(carried),
        )
    )
    ids = [c.citation_id for c in carried]
    claims = draw(
        st.lists(
            st.builds(
                Claim,
                text=st.text(max_size=12),
                citation_ids=st.lists(st.sampled_from(ids), min_size=1, max_size=4).map(tuple),
            ),
            min_size=min_claims,
            max_size=5,
        )
    )
    answer = CitedAnswer(
        claims=tuple(claims),
        citations=tuple(as_carried(c, shape=s) for c, s in zip(carried, shapes, strict=True)),
    )
    return answer, issued


def replace_citation(answer: CitedAnswer, index: int, **changes: Any) -> CitedAnswer:
    citations = list(answer.citations)
    citations[index] = citations[index].model_copy(update=changes)
    return answer.model_copy(update={"citations": tuple(citations)})


def replace_claim(answer: CitedAnswer, index: int, **changes: Any) -> CitedAnswer:
    claims = list(answer.claims)
    claims[index] = claims[index].model_copy(update=changes)
    return answer.model_copy(update={"claims": tuple(claims)})


def other_than(value: str) -> str:
    return f"{value}-other"


# ---------------------------------------------------------------------------------------------
# (a) a grounded answer passes


@given(grounded_answers())
def test_answer_citing_only_carried_issued_citations_is_grounded(
    case: tuple[CitedAnswer, list[Citation]],
) -> None:
    answer, issued = case
    assert find_violations(answer, issued, tenant=TENANT) == []
    assert check_grounding(answer, issued, tenant=TENANT) == "grounded"


def test_one_citation_may_support_several_claims_and_one_claim_several_citations() -> None:
    issued = [issued_citation(0), issued_citation(1, start=10)]
    answer = CitedAnswer(
        claims=(
            Claim(text="A.", citation_ids=("cit_0", "cit_1")),
            Claim(text="B.", citation_ids=("cit_0",)),
        ),
        citations=tuple(as_carried(c) for c in issued),
    )
    assert check_grounding(answer, issued, tenant=TENANT) == "grounded"


def test_carried_citation_no_claim_names_is_not_a_violation() -> None:
    issued = [issued_citation(0), issued_citation(1, start=10)]
    answer = CitedAnswer(
        claims=(Claim(text="A.", citation_ids=("cit_0",)),),
        citations=tuple(as_carried(c) for c in issued),
    )
    assert check_grounding(answer, issued, tenant=TENANT) == "grounded"


def test_erased_issued_citation_without_hash_still_grounds_an_answer_repeating_its_hash() -> None:
    erased = issued_citation(0).model_copy(update={"span_sha256": None})
    answer = CitedAnswer(
        claims=(Claim(text="A.", citation_ids=("cit_0",)),),
        citations=(as_carried(issued_citation(0)),),
    )
    assert check_grounding(answer, [erased], tenant=TENANT) == "grounded"


# ---------------------------------------------------------------------------------------------
# (b) each single mutation is rejected with the right class


@given(grounded_answers(), st.data())
def test_dropping_a_carried_citation_a_claim_uses_is_ungrounded(
    case: tuple[CitedAnswer, list[Citation]], data: st.DataObject
) -> None:
    answer, issued = case
    used = naive_provenance(answer)
    dropped = data.draw(st.sampled_from(used))
    mutated = answer.model_copy(
        update={"citations": tuple(c for c in answer.citations if c.citation_id != dropped)}
    )
    remaining = tuple(c.citation_id for c in mutated.citations)
    expected = [
        {
            "class": "ungrounded_citation",
            "claim": index,
            "missing": (dropped,),
            "available": remaining,
        }
        for index, claim in enumerate(answer.claims)
        if dropped in claim.citation_ids
    ]
    assert summary(find_violations(mutated, issued, tenant=TENANT)) == expected
    with pytest.raises(UngroundedCitationError) as raised:
        check_grounding(mutated, issued, tenant=TENANT)
    assert raised.value.code == "ungrounded_citation"
    assert raised.value.missing == [dropped]
    assert raised.value.available == list(remaining)


@pytest.mark.parametrize("field", ["document_version", "document_id", "chunk_id", "run_id"])
@given(case=grounded_answers(), data=st.data())
def test_changing_a_pinned_string_field_is_ungrounded(
    field: str, case: tuple[CitedAnswer, list[Citation]], data: st.DataObject
) -> None:
    answer, issued = case
    index = data.draw(st.integers(min_value=0, max_value=len(answer.citations) - 1))
    original = issued_by_id(issued)[answer.citations[index].citation_id]
    mutated = replace_citation(answer, index, **{field: other_than(getattr(original, field))})
    assert summary(find_violations(mutated, issued, tenant=TENANT)) == [
        {
            "class": "ungrounded_citation",
            "citation": index,
            "citation_id": original.citation_id,
            "field": field,
            "missing": (original.citation_id,),
            "available": tuple(c.citation_id for c in issued),
        }
    ]
    with pytest.raises(UngroundedCitationError):
        check_grounding(mutated, issued, tenant=TENANT)


@pytest.mark.parametrize("field", ["span", "span_utf8", "span_utf16"])
@given(case=grounded_answers(), data=st.data(), shift=st.integers(min_value=1, max_value=50))
def test_changing_a_pinned_span_is_ungrounded(
    field: str, case: tuple[CitedAnswer, list[Citation]], data: st.DataObject, shift: int
) -> None:
    answer, issued = case
    index = data.draw(st.integers(min_value=0, max_value=len(answer.citations) - 1))
    original = issued_by_id(issued)[answer.citations[index].citation_id]
    pinned: Span = getattr(original, field)
    moved = data.draw(
        st.sampled_from(
            [
                Span(start=pinned.start + shift, end=pinned.end + shift),
                Span(start=pinned.start, end=pinned.end + shift),
            ]
        )
    )
    mutated = replace_citation(answer, index, **{field: moved})
    assert summary(find_violations(mutated, issued, tenant=TENANT)) == [
        {
            "class": "ungrounded_citation",
            "citation": index,
            "citation_id": original.citation_id,
            "field": field,
            "missing": (original.citation_id,),
            "available": tuple(c.citation_id for c in issued),
        }
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("score", 0.123456789),
        ("branches", {"bm25": 99.0}),
        ("retrieved_at", datetime(2027, 1, 1, tzinfo=UTC)),
        ("locator", Locator(uri="https://elsewhere", page=99, section="Other")),
        ("span_sha256", "f" * 64),
    ],
)
def test_changing_any_other_pinned_field_is_ungrounded(field: str, value: Any) -> None:
    issued = [issued_citation(0), issued_citation(1, start=10)]
    answer = CitedAnswer(
        claims=(Claim(text="A.", citation_ids=("cit_0", "cit_1")),),
        citations=tuple(as_carried(c) for c in issued),
    )
    mutated = replace_citation(answer, 1, **{field: value})
    assert summary(find_violations(mutated, issued, tenant=TENANT)) == [
        {
            "class": "ungrounded_citation",
            "citation": 1,
            "citation_id": "cit_1",
            "field": field,
            "missing": ("cit_1",),
            "available": ("cit_0", "cit_1"),
        }
    ]


def test_every_differing_field_of_one_citation_is_listed() -> None:
    issued = [issued_citation(0)]
    answer = CitedAnswer(
        claims=(Claim(text="A.", citation_ids=("cit_0",)),),
        citations=(
            as_carried(issued[0]).model_copy(
                update={"document_version": "v9", "chunk_id": "c9", "span": Span(start=1, end=2)}
            ),
        ),
    )
    assert [v.field for v in find_violations(answer, issued, tenant=TENANT)] == [
        "document_version",
        "chunk_id",
        "span",
    ]


def test_citation_the_run_did_not_issue_is_ungrounded_with_the_runs_ids_available() -> None:
    issued = [issued_citation(0), issued_citation(1, start=10)]
    stranger = issued_citation(7).model_copy(update={"run_id": "run_2"})
    answer = CitedAnswer(
        claims=(Claim(text="A.", citation_ids=("cit_0", "cit_7")),),
        citations=(as_carried(issued[0]), as_carried(stranger)),
    )
    assert summary(find_violations(answer, issued, tenant=TENANT)) == [
        {
            "class": "ungrounded_citation",
            "citation": 1,
            "citation_id": "cit_7",
            "missing": ("cit_7",),
            "available": ("cit_0", "cit_1"),
        }
    ]


@given(grounded_answers(), st.data())
def test_changing_a_citations_tenant_is_a_tenant_crossing(
    case: tuple[CitedAnswer, list[Citation]], data: st.DataObject
) -> None:
    answer, issued = case
    index = data.draw(st.integers(min_value=0, max_value=len(answer.citations) - 1))
    cid = answer.citations[index].citation_id
    mutated = replace_citation(answer, index, tenant="globex")
    assert summary(find_violations(mutated, issued, tenant=TENANT)) == [
        {"class": "tenant_crossing", "citation": index, "citation_id": cid, "field": "tenant"}
    ]
    with pytest.raises(TenantCrossingError):
        check_grounding(mutated, issued, tenant=TENANT)


def test_tenant_crossing_is_decided_from_the_citation_alone() -> None:
    """Another tenant's citation is reported as a crossing even though the run never issued it."""
    answer = CitedAnswer(
        claims=(Claim(text="A.", citation_ids=("cit_9",)),),
        citations=(
            AnswerCitation(
                citation_id="cit_9", document_id="d", document_version="v", tenant="globex"
            ),
        ),
    )
    assert classes(find_violations(answer, [issued_citation(0)], tenant=TENANT)) == [
        "tenant_crossing"
    ]


@given(grounded_answers(), st.data())
def test_duplicating_a_citation_is_a_duplicate_citation_id(
    case: tuple[CitedAnswer, list[Citation]], data: st.DataObject
) -> None:
    answer, issued = case
    index = data.draw(st.integers(min_value=0, max_value=len(answer.citations) - 1))
    copy = answer.citations[index]
    mutated = answer.model_copy(update={"citations": (*answer.citations, copy)})
    assert summary(find_violations(mutated, issued, tenant=TENANT)) == [
        {
            "class": "duplicate_citation_id",
            "citation": len(answer.citations),
            "citation_id": copy.citation_id,
        }
    ]
    with pytest.raises(DuplicateCitationIdError):
        check_grounding(mutated, issued, tenant=TENANT)


@given(grounded_answers(), st.data())
def test_emptying_a_claims_citation_ids_is_an_uncited_claim(
    case: tuple[CitedAnswer, list[Citation]], data: st.DataObject
) -> None:
    answer, issued = case
    index = data.draw(st.integers(min_value=0, max_value=len(answer.claims) - 1))
    mutated = replace_claim(answer, index, citation_ids=())
    assert summary(find_violations(mutated, issued, tenant=TENANT)) == [
        {"class": "uncited_claim", "claim": index}
    ]
    with pytest.raises(UncitedClaimError):
        check_grounding(mutated, issued, tenant=TENANT)


# ---------------------------------------------------------------------------------------------
# Refusals and empty runs


def test_refusal_over_an_empty_run_is_refused() -> None:
    assert check_grounding(CitedAnswer(refusal=True), [], tenant=TENANT) == "refused"


def test_refusal_over_a_run_with_citations_is_refused() -> None:
    assert check_grounding(CitedAnswer(refusal=True), [issued_citation(0)], tenant=TENANT) == (
        "refused"
    )


def test_refusal_with_claims_cannot_be_built() -> None:
    with pytest.raises(ValidationError, match="a refusal carries no claims"):
        CitedAnswer(refusal=True, claims=(Claim(text="A.", citation_ids=("cit_0",)),))


@pytest.mark.parametrize("issued", [[], [issued_citation(0)]])
def test_non_refusal_with_no_claims_is_uncited(issued: list[Citation]) -> None:
    violations = find_violations(CitedAnswer(), issued, tenant=TENANT)
    assert summary(violations) == [{"class": "uncited_claim"}]
    with pytest.raises(UncitedClaimError):
        check_grounding(CitedAnswer(), issued, tenant=TENANT)


def test_every_claim_over_an_empty_run_is_uncited() -> None:
    citation = issued_citation(0)
    answer = CitedAnswer(
        claims=(
            Claim(text="A.", citation_ids=("cit_0",)),
            Claim(text="B.", citation_ids=("cit_0",)),
        ),
        citations=(as_carried(citation),),
    )
    assert summary(find_violations(answer, [], tenant=TENANT)) == [
        {
            "class": "ungrounded_citation",
            "citation": 0,
            "citation_id": "cit_0",
            "missing": ("cit_0",),
            "available": (),
        },
        {"class": "uncited_claim", "claim": 0},
        {"class": "uncited_claim", "claim": 1},
    ]


def test_claim_without_citations_over_an_empty_run_is_uncited() -> None:
    answer = CitedAnswer(claims=(Claim(text="A.", citation_ids=()),))
    violations = find_violations(answer, [], tenant=TENANT)
    assert set(classes(violations)) == {"uncited_claim"}
    assert {v.claim for v in violations} == {0}
    with pytest.raises(UncitedClaimError):
        check_grounding(answer, [], tenant=TENANT)


# ---------------------------------------------------------------------------------------------
# (c) checking never modifies the answer


@given(issued_runs(), issued_runs(), st.sampled_from(["full", "essentials"]))
def test_each_pinned_value_is_its_field_and_equal_exactly_when_the_field_is(
    first: list[Citation], second: list[Citation], shape: str
) -> None:
    # The check compares `pinned_values`, not the models: each value must stand at its field's
    # place in PINNED_FIELDS, and differ exactly when its field does. One field at a time is
    # given another citation's value (or an answer's missing one), and only its place may move.
    later = RETRIEVED_AT + timedelta(seconds=1)
    others = [c.model_copy(update={"run_id": "run_2", "retrieved_at": later}) for c in second]
    pairs: list[tuple[Citation | AnswerCitation, Citation | AnswerCitation]] = [
        *zip(first, others, strict=False),
        *((as_carried(a), as_carried(b, shape=shape)) for a, b in zip(first, others, strict=False)),
    ]
    for citation, other in pairs:
        pinned = pinned_values(citation)
        assert len(pinned) == len(PINNED_FIELDS)
        for place, field in enumerate(PINNED_FIELDS):
            changed = pinned_values(citation.model_copy(update={field: getattr(other, field)}))
            moved = [i for i, (a, b) in enumerate(zip(pinned, changed, strict=True)) if a != b]
            assert moved == ([place] if getattr(citation, field) != getattr(other, field) else [])
        if isinstance(citation, Citation):
            assert citation.pinned == pinned


@given(grounded_answers(), st.booleans())
def test_checking_never_modifies_the_answer_or_the_issued_citations(
    case: tuple[CitedAnswer, list[Citation]], break_it: bool
) -> None:
    answer, issued = case
    if break_it:
        answer = replace_claim(answer, 0, citation_ids=())
    before = answer.model_dump()
    issued_before = [c.model_dump() for c in issued]
    try:
        check_grounding(answer, issued, tenant=TENANT)
    except GroundingError:
        assert break_it
    assert answer.model_dump() == before
    assert [c.model_dump() for c in issued] == issued_before


def test_answer_models_are_frozen() -> None:
    citation = as_carried(issued_citation(0))
    claim = Claim(text="A.", citation_ids=("cit_0",))
    answer = CitedAnswer(claims=(claim,), citations=(citation,))
    with pytest.raises(ValidationError):
        answer.claims = ()  # type: ignore[misc]
    with pytest.raises(ValidationError):
        claim.citation_ids = ()  # type: ignore[misc]
    with pytest.raises(ValidationError):
        citation.tenant = "globex"  # type: ignore[misc]
    assert isinstance(answer.claims, tuple)
    assert isinstance(claim.citation_ids, tuple)


def test_answer_models_refuse_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        CitedAnswer.model_validate({"claims": [], "refusal": True, "repair": True})
    with pytest.raises(ValidationError):
        Claim.model_validate({"text": "A.", "citation_ids": [], "sources": []})


def test_value_objects_are_equal_when_of_one_type_with_equal_fields() -> None:
    span = Span(start=1, end=2)

    assert span == Span(start=1, end=2)
    assert hash(span) == hash(Span(start=1, end=2))
    assert span != Span(start=1, end=3)
    assert span != {"start": 1, "end": 2}
    assert Locator(uri="u") != Locator(uri="u", page=1)
    assert Locator() != Span(start=1, end=2)


@pytest.mark.parametrize("where", ["score", "branches"])
@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_answer_citations_refuse_scores_json_cannot_write(where: str, number: float) -> None:
    carried = as_carried(issued_citation(0)).model_dump()
    carried[where] = {"bm25": number} if where == "branches" else number

    with pytest.raises(ValidationError, match="finite"):
        AnswerCitation.model_validate(carried)


def test_an_answers_negative_zero_scores_are_kept_as_given() -> None:
    carried = as_carried(issued_citation(0)).model_dump() | {
        "score": -0.0,
        "branches": {"bm25": -0.0},
    }

    validated = AnswerCitation.model_validate(carried)

    assert validated.branches is not None
    assert (str(validated.score), str(validated.branches["bm25"])) == ("-0.0", "-0.0")


def test_an_answer_repeating_zero_scores_as_negative_zero_is_grounded() -> None:
    issued = issued_citation(0).model_copy(update={"score": 0.0, "branches": {"bm25": 0.0}})
    carried = as_carried(issued).model_copy(update={"score": -0.0, "branches": {"bm25": -0.0}})
    answer = CitedAnswer(
        claims=(Claim(text="Refunds take 14 days.", citation_ids=("cit_0",)),),
        citations=(carried,),
    )

    assert find_violations(answer, [issued], tenant=TENANT) == []


# ---------------------------------------------------------------------------------------------
# (d) the code is the first class present in the order


MUTATIONS = ("tenant_crossing", "duplicate_citation_id", "ungrounded_citation", "uncited_claim")


def _base_answer() -> tuple[CitedAnswer, list[Citation]]:
    issued = [issued_citation(i, start=10 * i) for i in range(4)]
    answer = CitedAnswer(
        claims=tuple(Claim(text=f"Claim {i}.", citation_ids=(f"cit_{i}",)) for i in range(4)),
        citations=tuple(as_carried(c) for c in issued),
    )
    return answer, issued


def _mutate(answer: CitedAnswer, kind: str) -> CitedAnswer:
    """Apply one mutation of `kind`, each to its own citation or claim so they do not overlap."""
    if kind == "tenant_crossing":
        return replace_citation(answer, 0, tenant="globex")
    if kind == "duplicate_citation_id":
        return answer.model_copy(update={"citations": (*answer.citations, answer.citations[1])})
    if kind == "ungrounded_citation":
        return replace_citation(answer, 2, document_version="v-never")
    return replace_claim(answer, 3, citation_ids=())


@given(st.sets(st.sampled_from(MUTATIONS), min_size=1))
def test_code_is_the_first_class_present_in_order(kinds: set[str]) -> None:
    answer, issued = _base_answer()
    for kind in MUTATIONS:
        if kind in kinds:
            answer = _mutate(answer, kind)
    violations = find_violations(answer, issued, tenant=TENANT)
    assert set(classes(violations)) == kinds
    assert len(violations) == len(kinds)
    expected = next(kind for kind in ORDER if kind in kinds)
    with pytest.raises(GroundingError) as raised:
        check_grounding(answer, issued, tenant=TENANT)
    assert raised.value.code == expected
    assert type(raised.value) is ERRORS_BY_CODE[expected]
    assert raised.value.violations == [
        v.model_dump(by_alias=True, exclude_none=True) for v in violations
    ]


def test_violations_keep_the_order_they_were_found_in_whatever_the_code() -> None:
    answer, issued = _base_answer()
    for kind in reversed(MUTATIONS):
        answer = _mutate(answer, kind)
    error = rejection(find_violations(answer, issued, tenant=TENANT))
    assert isinstance(error, TenantCrossingError)
    assert [v["class"] for v in error.violations] == [
        "tenant_crossing",
        "ungrounded_citation",
        "duplicate_citation_id",
        "uncited_claim",
    ]
    assert error.detail == "the answer is not grounded: 4 violations"


def test_violation_order_keeps_the_contracts_order() -> None:
    codes = [cls.code for cls in VIOLATION_ORDER]
    assert [code for code in codes if code in ORDER] == list(ORDER)
    assert ERRORS_BY_CODE["configuration_error"].code == "configuration_error"


def test_no_violations_is_no_rejection() -> None:
    assert rejection([]) is None


def test_single_violation_detail_is_singular() -> None:
    error = rejection([Violation(violation_class="uncited_claim", claim=0, detail="x")])
    assert isinstance(error, UncitedClaimError)
    assert error.detail == "the answer is not grounded: 1 violation"
    assert error.violations == [{"class": "uncited_claim", "claim": 0, "detail": "x"}]


# ---------------------------------------------------------------------------------------------
# text, sources, provenance


@given(grounded_answers())
def test_provenance_is_every_cited_id_once_in_first_use_order(
    case: tuple[CitedAnswer, list[Citation]],
) -> None:
    answer, _ = case
    provenance = answer.provenance()
    assert provenance == naive_provenance(answer)
    assert len(provenance) == len(set(provenance))
    assert set(provenance) == {cid for claim in answer.claims for cid in claim.citation_ids}


@given(grounded_answers())
def test_text_is_the_claims_text_in_order(case: tuple[CitedAnswer, list[Citation]]) -> None:
    answer, _ = case
    assert answer.text == " ".join(claim.text for claim in answer.claims)


@given(grounded_answers())
def test_sources_are_the_carried_citations_a_claim_names_in_its_order(
    case: tuple[CitedAnswer, list[Citation]],
) -> None:
    answer, _ = case
    for claim in answer.claims:
        sources = answer.sources(claim)
        assert [s.citation_id for s in sources] == list(claim.citation_ids)
        assert all(s in answer.citations for s in sources)


def test_sources_skip_ids_the_answer_does_not_carry() -> None:
    answer = CitedAnswer(
        claims=(Claim(text="A.", citation_ids=("cit_9", "cit_0")),),
        citations=(as_carried(issued_citation(0)),),
    )
    assert answer.sources(answer.claims[0]) == [answer.citations[0]]


def test_text_and_provenance_of_a_worked_example() -> None:
    answer = CitedAnswer(
        claims=(
            Claim(text="Refunds take 30 days.", citation_ids=("cit_b", "cit_a")),
            Claim(text="返金は三十日以内。", citation_ids=("cit_a", "cit_c", "cit_b")),
            Claim(text="Receipts 🧾 needed.", citation_ids=("cit_c",)),
        ),
    )
    assert answer.text == "Refunds take 30 days. 返金は三十日以内。 Receipts 🧾 needed."
    assert answer.provenance() == ["cit_b", "cit_a", "cit_c"]
    assert CitedAnswer(refusal=True).text == ""
    assert CitedAnswer(refusal=True).provenance() == []


def issued_by_id(issued: list[Citation]) -> dict[str, Citation]:
    return {c.citation_id: c for c in issued}
