"""cite, pin_chunks and chunk_problems, without a database: examples and properties."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from app.bodies import json_response
from app.grounding import Citation, ConfigurationError, Locator, RetrievalResult, Span, cite
from app.grounding.cite import (
    ChunkBounds,
    PinnedChunk,
    RegisteredVersion,
    chunk_problems,
    issue,
    keyed_span_hash,
    pin_chunks,
    span_sha256,
)
from app.runs.schemas import RunRead

KEY = b"k" * 32
RETRIEVED_AT = datetime(2026, 11, 3, 9, 30, tzinfo=UTC)
TEXT = "Refunds are issued within 30 days. Famille 👨‍👩‍👧 café. 返金は三十日以内。 Receipt 🧾."


def counter(prefix: str = "cit") -> tuple[Callable[[], str], list[str]]:
    """An id source that records every id it hands out."""
    handed: list[str] = []

    def new_id() -> str:
        handed.append(f"{prefix}_{len(handed)}")
        return handed[-1]

    return new_id, handed


def registry(
    text: str = TEXT, *, erased: bool = False, uri: str | None = "https://handbook/refunds"
) -> dict[tuple[str, str], RegisteredVersion]:
    first = text.index("Famille")
    second = text.index("返金")
    chunks = pin_chunks(
        text,
        [
            ChunkBounds(chunk_id="c1", start=0, end=first, page=1, section="Scope"),
            ChunkBounds(chunk_id="c2", start=first, end=second, uri="https://handbook/c2"),
            ChunkBounds(chunk_id="c3", start=second, end=len(text)),
        ],
        hmac_key=KEY,
    )
    return {
        ("refund-policy", "2026-11-03"): RegisteredVersion(
            erased=erased, uri=uri, chunks={c.chunk_id: c for c in chunks}
        )
    }


def result(of: str = "c1", **overrides: object) -> RetrievalResult:
    """A result that repeats chunk `of` of the default registry exactly, but for `overrides`."""
    pinned = registry()[("refund-policy", "2026-11-03")].chunks[of]
    fields: dict[str, object] = {
        "document_id": "refund-policy",
        "version": "2026-11-03",
        "chunk_id": of,
        "start": pinned.start,
        "end": pinned.end,
        "score": 0.82,
        "branches": {"bm25": 11.2, "vector": 0.79, "rerank": 0.93},
    }
    return RetrievalResult.model_validate(fields | overrides)


def run_cite(
    results: list[RetrievalResult], reg: dict[tuple[str, str], RegisteredVersion] | None = None
) -> list[Citation]:
    new_id, _ = counter()
    return list(
        cite(
            results,
            registry() if reg is None else reg,
            run_id="run_1",
            tenant="acme",
            retrieved_at=RETRIEVED_AT,
            new_citation_id=new_id,
        )
    )


def configuration_errors(
    results: list[RetrievalResult], reg: dict[tuple[str, str], RegisteredVersion] | None = None
) -> tuple[ConfigurationError, list[str]]:
    new_id, handed = counter()
    with pytest.raises(ConfigurationError) as raised:
        cite(
            results,
            registry() if reg is None else reg,
            run_id="run_1",
            tenant="acme",
            retrieved_at=RETRIEVED_AT,
            new_citation_id=new_id,
        )
    return raised.value, handed


# ---------------------------------------------------------------------------------------------
# cite


def test_cite_issues_one_citation_per_result_in_order_pinning_what_was_read() -> None:
    new_id, handed = counter()
    reg = registry()
    citations = cite(
        [result("c3"), result("c1", score=None, branches={}), result("c2")],
        reg,
        run_id="run_1",
        tenant="acme",
        retrieved_at=RETRIEVED_AT,
        new_citation_id=new_id,
    )
    assert handed == ["cit_0", "cit_1", "cit_2"]
    assert [c.citation_id for c in citations] == handed
    assert [c.chunk_id for c in citations] == ["c3", "c1", "c2"]
    chunks = reg[("refund-policy", "2026-11-03")].chunks
    first = citations[0]
    assert first.model_dump() == {
        "citation_id": "cit_0",
        "run_id": "run_1",
        "tenant": "acme",
        "document_id": "refund-policy",
        "document_version": "2026-11-03",
        "chunk_id": "c3",
        "span": {"start": chunks["c3"].start, "end": chunks["c3"].end},
        "score": 0.82,
        "branches": {"bm25": 11.2, "vector": 0.79, "rerank": 0.93},
        "retrieved_at": RETRIEVED_AT,
        "locator": {"uri": "https://handbook/refunds", "page": None, "section": None},
        "span_sha256": span_sha256(TEXT[TEXT.index("返金") :]),
        "span_utf8": {"start": chunks["c3"].utf8_start, "end": chunks["c3"].utf8_end},
        "span_utf16": {"start": chunks["c3"].utf16_start, "end": chunks["c3"].utf16_end},
    }
    assert citations[1].score is None
    assert citations[1].branches == {}
    assert citations[1].locator == Locator(uri="https://handbook/refunds", page=1, section="Scope")
    # A chunk's own uri wins over its version's.
    assert citations[2].locator == Locator(uri="https://handbook/c2", page=None, section=None)


def test_cite_of_no_results_issues_nothing() -> None:
    assert run_cite([]) == []


def test_cite_without_a_version_uri_leaves_the_locator_uri_empty() -> None:
    [citation] = run_cite([result("c3")], registry(uri=None))
    assert citation.locator == Locator(uri=None, page=None, section=None)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"version": None}, [{"index": 0, "field": "version", "problem": "missing"}]),
        ({"start": None}, [{"index": 0, "field": "start", "problem": "missing"}]),
        ({"end": None}, [{"index": 0, "field": "end", "problem": "missing"}]),
        (
            {"version": None, "start": None, "end": None},
            [
                {"index": 0, "field": "version", "problem": "missing"},
                {"index": 0, "field": "start", "problem": "missing"},
                {"index": 0, "field": "end", "problem": "missing"},
            ],
        ),
        (
            {"version": "2099-01-01"},
            [{"index": 0, "field": "version", "problem": "unknown_version"}],
        ),
        (
            {"document_id": "other-doc"},
            [{"index": 0, "field": "version", "problem": "unknown_version"}],
        ),
        ({"chunk_id": "c9"}, [{"index": 0, "field": "chunk_id", "problem": "unknown_chunk"}]),
        ({"start": 1}, [{"index": 0, "field": "start", "problem": "span_mismatch"}]),
        ({"end": 5}, [{"index": 0, "field": "end", "problem": "span_mismatch"}]),
        (
            {"start": 1, "end": 5},
            [
                {"index": 0, "field": "start", "problem": "span_mismatch"},
                {"index": 0, "field": "end", "problem": "span_mismatch"},
            ],
        ),
        (
            {"start": None, "end": 5},
            [
                {"index": 0, "field": "start", "problem": "missing"},
                {"index": 0, "field": "end", "problem": "span_mismatch"},
            ],
        ),
    ],
)
def test_a_chunk_that_cannot_be_pinned_is_a_configuration_error(
    overrides: dict[str, object], expected: list[dict[str, object]]
) -> None:
    error, handed = configuration_errors([result("c1", **overrides)])
    assert error.errors == expected
    assert error.code == "configuration_error"
    assert error.detail == "1 of 1 retrieved chunks cannot be pinned; no citation was issued"
    assert handed == []


def test_erased_version_is_a_configuration_error() -> None:
    error, handed = configuration_errors([result("c1")], registry(erased=True))
    assert error.errors == [{"index": 0, "field": "version", "problem": "erased_version"}]
    assert handed == []


def test_every_bad_result_is_listed_and_nothing_is_issued() -> None:
    error, handed = configuration_errors(
        [
            result("c1"),
            result("c2", version=None),
            result("c3"),
            result("c1", chunk_id="c9"),
            result("c3", end=3, start=None),
        ]
    )
    assert error.errors == [
        {"index": 1, "field": "version", "problem": "missing"},
        {"index": 3, "field": "chunk_id", "problem": "unknown_chunk"},
        {"index": 4, "field": "start", "problem": "missing"},
        {"index": 4, "field": "end", "problem": "span_mismatch"},
    ]
    assert error.detail == "3 of 5 retrieved chunks cannot be pinned; no citation was issued"
    assert handed == []


# ---------------------------------------------------------------------------------------------
# pin_chunks: offsets in three encodings against a naive computation


def naive_offsets(text: str, position: int) -> tuple[int, int]:
    prefix = text[:position]
    return len(prefix.encode("utf-8")), len(prefix.encode("utf-16-le")) // 2


# Any code point but surrogates; emoji, ZWJ sequences, combining marks and CJK drawn often.
characters = st.characters(codec="utf-8") | st.sampled_from(
    ["👨‍👩‍👧", "🧾", "😀", "\U0001f3fd", "\u200d", "e\u0301", "\u0301", "返", "金", "𝄞", "a", " "]
)
unicode_text = st.lists(characters, min_size=1, max_size=80).map("".join)


@st.composite
def texts_with_chunks(
    draw: st.DrawFn, text: st.SearchStrategy[str] = unicode_text
) -> tuple[str, list[ChunkBounds]]:
    value = draw(text)
    count = draw(st.integers(min_value=1, max_value=6))
    chunks = []
    for index in range(count):
        start = draw(st.integers(min_value=0, max_value=len(value) - 1))
        end = draw(st.integers(min_value=start + 1, max_value=len(value)))
        chunks.append(ChunkBounds(chunk_id=f"c{index}", start=start, end=end, page=index))
    return value, chunks


def check_pinned(text: str, chunks: list[ChunkBounds], pinned: list[PinnedChunk]) -> None:
    assert [p.chunk_id for p in pinned] == [c.chunk_id for c in chunks]
    encoded8 = text.encode("utf-8")
    encoded16 = text.encode("utf-16-le")
    for chunk, pin in zip(chunks, pinned, strict=True):
        cited = text[chunk.start : chunk.end]
        start8, start16 = naive_offsets(text, chunk.start)
        end8, end16 = naive_offsets(text, chunk.end)
        assert (pin.start, pin.end) == (chunk.start, chunk.end)
        assert (pin.utf8_start, pin.utf8_end) == (start8, end8)
        assert (pin.utf16_start, pin.utf16_end) == (start16, end16)
        assert encoded8[start8:end8].decode("utf-8") == cited
        assert encoded16[2 * start16 : 2 * end16].decode("utf-16-le") == cited
        assert pin.span_sha256 == hashlib.sha256(cited.encode("utf-8")).hexdigest()
        assert pin.span_hmac == hmac.new(KEY, cited.encode("utf-8"), "sha256").hexdigest()
        assert (pin.page, pin.section, pin.uri) == (chunk.page, chunk.section, chunk.uri)


@given(texts_with_chunks())
def test_pinned_offsets_match_a_naive_computation_on_unicode_text(
    case: tuple[str, list[ChunkBounds]],
) -> None:
    text, chunks = case
    check_pinned(text, chunks, pin_chunks(text, chunks, hmac_key=KEY))


@given(texts_with_chunks(st.text("abc XYZ.,0123456789", min_size=1, max_size=80)))
def test_pinned_offsets_of_ascii_text_are_the_code_point_offsets(
    case: tuple[str, list[ChunkBounds]],
) -> None:
    text, chunks = case
    pinned = pin_chunks(text, chunks, hmac_key=KEY)
    check_pinned(text, chunks, pinned)
    assert all(
        (p.start, p.end) == (p.utf8_start, p.utf8_end) == (p.utf16_start, p.utf16_end)
        for p in pinned
    )


def test_pinned_offsets_across_a_zwj_sequence_and_an_accent() -> None:
    text = "a👨‍👩‍👧é返"
    [pin] = pin_chunks(text, [ChunkBounds(chunk_id="c", start=1, end=7)], hmac_key=KEY)
    # 👨 (4 bytes, 2 units) ZWJ (3, 1) 👩 (4, 2) ZWJ (3, 1) 👧 (4, 2) é (2, 1)
    assert (pin.start, pin.end) == (1, 7)
    assert (pin.utf8_start, pin.utf8_end) == (1, 21)
    assert (pin.utf16_start, pin.utf16_end) == (1, 10)


def test_overlapping_and_repeated_bounds_are_pinned_each() -> None:
    text = "🧾🧾🧾"
    chunks = [
        ChunkBounds(chunk_id="a", start=0, end=3),
        ChunkBounds(chunk_id="b", start=1, end=2),
        ChunkBounds(chunk_id="c", start=1, end=2),
    ]
    pinned = pin_chunks(text, chunks, hmac_key=KEY)
    assert [(p.utf8_start, p.utf8_end, p.utf16_start, p.utf16_end) for p in pinned] == [
        (0, 12, 0, 6),
        (4, 8, 2, 4),
        (4, 8, 2, 4),
    ]


def test_span_hashes() -> None:
    assert span_sha256("返金") == hashlib.sha256("返金".encode()).hexdigest()
    assert keyed_span_hash(KEY, "返金") != span_sha256("返金")
    assert keyed_span_hash(KEY, "返金") != keyed_span_hash(b"other", "返金")
    assert keyed_span_hash(KEY, "返金") == keyed_span_hash(KEY, "返金")


@given(texts_with_chunks())
def test_cite_over_pinned_chunks_carries_their_offsets_and_hash(
    case: tuple[str, list[ChunkBounds]],
) -> None:
    text, chunks = case
    unique = list({c.chunk_id: c for c in chunks}.values())
    pinned = pin_chunks(text, unique, hmac_key=KEY)
    reg = {
        ("d", "v"): RegisteredVersion(
            erased=False, uri=None, chunks={p.chunk_id: p for p in pinned}
        )
    }
    results = [
        RetrievalResult(document_id="d", version="v", chunk_id=p.chunk_id, start=p.start, end=p.end)
        for p in pinned
    ]
    new_id, _ = counter()
    citations = cite(
        results, reg, run_id="r", tenant="acme", retrieved_at=RETRIEVED_AT, new_citation_id=new_id
    )
    for citation, pin in zip(citations, pinned, strict=True):
        assert (citation.span, citation.span_utf8, citation.span_utf16) == (
            Span(start=pin.start, end=pin.end),
            Span(start=pin.utf8_start, end=pin.utf8_end),
            Span(start=pin.utf16_start, end=pin.utf16_end),
        )
        assert citation.span_sha256 == span_sha256(text[pin.start : pin.end])


finite = st.floats(allow_nan=False, allow_infinity=False)


@given(
    texts_with_chunks(),
    st.lists(st.none() | finite, min_size=6, max_size=6),
    st.dictionaries(st.text(max_size=8), finite, max_size=3),
    st.none() | st.text(max_size=20),
    st.datetimes(timezones=st.just(UTC)),
)
def test_issued_fields_are_written_as_pydantic_writes_the_citations_cite_makes_of_them(
    case: tuple[str, list[ChunkBounds]],
    scores: list[float | None],
    branches: dict[str, float],
    uri: str | None,
    retrieved_at: datetime,
) -> None:
    # `POST /v1/runs` answers with the fields `issue` gives, written by orjson: the bytes must
    # be those FastAPI has pydantic write for the run's `Citation`s, which `cite` validates.
    text, chunks = case
    unique = list({c.chunk_id: c for c in chunks}.values())
    pinned = pin_chunks(text, unique, hmac_key=KEY)
    reg = {
        ("d", "v"): RegisteredVersion(erased=False, uri=uri, chunks={p.chunk_id: p for p in pinned})
    }
    results = [
        RetrievalResult(
            document_id="d",
            version="v",
            chunk_id=p.chunk_id,
            start=p.start,
            end=p.end,
            score=score,
            branches=branches,
        )
        for p, score in zip(pinned, scores, strict=False)
    ]
    run = {
        "run_id": "r",
        "tenant": "acme",
        "query": text,
        "scope": uri,
        "retrieved_at": retrieved_at,
    }

    def issued_by(made: Callable[..., list[Any]]) -> list[Any]:
        new_id, _ = counter()
        return made(
            results,
            reg,
            run_id="r",
            tenant="acme",
            retrieved_at=retrieved_at,
            new_citation_id=new_id,
        )

    fields, models = issued_by(issue), issued_by(cite)
    written = TypeAdapter(RunRead).dump_json(RunRead(**run, citations=models), by_alias=True)
    assert json_response({**run, "citations": fields}).body == written


# ---------------------------------------------------------------------------------------------
# chunk_problems


def test_chunks_that_are_spans_of_the_text_have_no_problems() -> None:
    chunks = [ChunkBounds(chunk_id="a", start=0, end=3), ChunkBounds(chunk_id="b", start=2, end=4)]
    assert chunk_problems("🧾abc", chunks) == []


def test_every_chunk_problem_is_listed_by_index_and_field() -> None:
    chunks = [
        ChunkBounds(chunk_id="a", start=0, end=2),
        ChunkBounds(chunk_id="a", start=1, end=2),
        ChunkBounds(chunk_id="b", start=4, end=6),
        ChunkBounds(chunk_id="c", start=2, end=2),
        ChunkBounds(chunk_id="d", start=3, end=1),
        ChunkBounds(chunk_id="e", start=-1, end=1),
        ChunkBounds(chunk_id="f", start=1, end=5),
    ]
    assert chunk_problems("返金🧾.", chunks) == [
        {"index": 1, "field": "chunk_id", "problem": "duplicate"},
        {"index": 2, "field": "start", "problem": "outside_text"},
        {"index": 2, "field": "end", "problem": "outside_text"},
        {"index": 3, "field": "end", "problem": "not_after_start"},
        {"index": 4, "field": "end", "problem": "not_after_start"},
        {"index": 5, "field": "start", "problem": "outside_text"},
        {"index": 6, "field": "end", "problem": "outside_text"},
    ]


def test_chunks_of_empty_text_are_outside_it() -> None:
    assert chunk_problems("", [ChunkBounds(chunk_id="a", start=0, end=1)]) == [
        {"index": 0, "field": "start", "problem": "outside_text"},
        {"index": 0, "field": "end", "problem": "outside_text"},
    ]


@given(
    unicode_text,
    st.lists(
        st.tuples(
            st.sampled_from("abcd"),
            st.integers(min_value=-2, max_value=90),
            st.integers(min_value=-2, max_value=90),
        ),
        max_size=6,
    ),
)
def test_chunk_problems_are_empty_exactly_when_chunks_are_unique_spans_of_the_text(
    text: str, bounds: list[tuple[str, int, int]]
) -> None:
    chunks = [ChunkBounds(chunk_id=cid, start=s, end=e) for cid, s, e in bounds]
    ids = [c.chunk_id for c in chunks]
    valid = len(set(ids)) == len(ids) and all(0 <= c.start < c.end <= len(text) for c in chunks)
    problems = chunk_problems(text, chunks)
    assert (problems == []) == valid
    assert {p["index"] for p in problems} <= set(range(len(chunks)))
    if valid:
        check_pinned(text, chunks, pin_chunks(text, chunks, hmac_key=KEY))
