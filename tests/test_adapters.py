"""Vendor responses -> CitedAnswer, built with the vendors' own SDK types; then verified for real.

The pure tests need no fixture. The end-to-end ones adapt a response over a run the service
recorded and submit the answer through the client, over the app's real transaction handling.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import cohere
import httpx
import pytest
from anthropic.types import (
    CitationCharLocation,
    CitationContentBlockLocation,
    CitationPageLocation,
    CitationsSearchResultLocation,
    CitationsWebSearchResultLocation,
    Message,
    TextBlock,
    ThinkingBlock,
    Usage,
)
from openai.types.responses import (
    Response,
    ResponseFileSearchToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
)
from openai.types.responses.response_file_search_tool_call import Result as FileSearchResult
from openai.types.responses.response_output_text import (
    AnnotationFileCitation,
    AnnotationFilePath,
    AnnotationURLCitation,
)

from app import client as grounding
from app.adapters import answer_from_chat, answer_from_message, answer_from_response
from app.adapters.claims import AnswerText, sentence_spans
from app.client import GroundingClient, RetrievedRun
from app.grounding.models import Citation, Claim, Locator, Quote, Span
from tests.factories import POLICY_TEXT, Keys, policy_chunks, register_version, results_for

# The policy's chunks, as the model was shown them (the run's citations, in order).
CHUNKS = [POLICY_TEXT[c["start"] : c["end"]] for c in policy_chunks()]


def issued(count: int = 4) -> list[Citation]:
    """Citations as a run issues them, over the policy's chunks."""
    return [
        Citation(
            citation_id=f"cit_{i}",
            run_id="run_1",
            tenant="acme",
            document_id="refund-policy",
            document_version="2026-11-03",
            chunk_id=f"c{i + 1}",
            span=Span(start=0, end=1),
            score=0.9,
            branches={"bm25": 11.2},
            retrieved_at=datetime(2026, 11, 3, tzinfo=UTC),
            locator=Locator(uri="https://handbook/refunds"),
            span_sha256="0" * 64,
            span_utf8=Span(start=0, end=1),
            span_utf16=Span(start=0, end=1),
        )
        for i in range(count)
    ]


def claims_of(answer: Any) -> list[tuple[str, tuple[str, ...]]]:
    return [(claim.text, claim.citation_ids) for claim in answer.claims]


# Anthropic ------------------------------------------------------------------------------------


def message(*content: Any, stop_reason: Any = "end_turn") -> Message:
    return Message(
        id="msg_01",
        type="message",
        role="assistant",
        model="claude-sonnet-4-6",
        content=list(content),
        stop_reason=stop_reason,
        stop_sequence=None,
        usage=Usage(input_tokens=2048, output_tokens=96),
    )


def text(value: str, *citations: Any) -> TextBlock:
    return TextBlock(type="text", text=value, citations=list(citations) or None)


def char_location(index: int, cited: str) -> CitationCharLocation:
    return CitationCharLocation(
        type="char_location",
        cited_text=cited,
        document_index=index,
        document_title="Refunds",
        start_char_index=0,
        end_char_index=len(cited),
    )


def claude_answer() -> Message:
    """What Claude answers with citations on: connective text between cited blocks."""
    return message(
        ThinkingBlock(type="thinking", thinking="The policy covers this.", signature="sig"),
        text("According to the refund policy, "),
        text(
            "refunds are issued within 30 days",
            char_location(0, "Refunds are issued within 30 days."),
        ),
        text(", and "),
        text("exchanges need a receipt", char_location(3, "Exchanges need a receipt")),
        text(".\n\n"),
        text("In Japanese: "),
        text("返金は三十日以内に行われます。", char_location(2, "返金は三十日以内に行われます。")),
        text(" "),
        text("Store credit never expires."),
    )


def test_claude_sentences_rest_on_every_cited_block_they_span() -> None:
    citations = issued()

    answer = answer_from_message(claude_answer(), citations)

    assert claims_of(answer) == [
        (
            "According to the refund policy, refunds are issued within 30 days, and exchanges "
            "need a receipt.",
            ("cit_0", "cit_3"),
        ),
        ("In Japanese: 返金は三十日以内に行われます。", ("cit_2",)),
        ("Store credit never expires.", ()),
    ]
    assert answer.claims[0].quotes == (
        Quote(citation_id="cit_0", text="Refunds are issued within 30 days."),
        Quote(citation_id="cit_3", text="Exchanges need a receipt"),
    )
    assert [c.citation_id for c in answer.citations] == ["cit_0", "cit_2", "cit_3"]
    assert answer.citations[0].model_dump() == citations[0].model_dump()
    assert not answer.refusal


def test_claude_plain_dict_form_gives_the_same_answer() -> None:
    response = claude_answer()

    assert answer_from_message(response.model_dump(), issued()) == answer_from_message(
        response, issued()
    )


def test_every_claude_document_location_names_the_runs_citation_at_its_index() -> None:
    response = message(
        text(
            "Refunds take 30 days.",
            CitationPageLocation(
                type="page_location",
                cited_text="Refunds",
                document_index=1,
                start_page_number=1,
                end_page_number=2,
            ),
            CitationContentBlockLocation(
                type="content_block_location",
                cited_text="30 days",
                document_index=2,
                start_block_index=0,
                end_block_index=1,
            ),
            CitationsSearchResultLocation(
                type="search_result_location",
                cited_text="within 30 days",
                search_result_index=3,
                source="https://handbook/refunds",
                start_block_index=0,
                end_block_index=1,
                title="Refunds",
            ),
        )
    )

    answer = answer_from_message(response, issued())

    assert claims_of(answer) == [("Refunds take 30 days.", ("cit_1", "cit_2", "cit_3"))]
    assert [q.citation_id for q in answer.claims[0].quotes] == ["cit_1", "cit_2", "cit_3"]


def test_claude_citations_outside_the_run_are_ids_the_answer_does_not_carry() -> None:
    response = message(
        text("Refunds take 30 days.", char_location(9, "Refunds")),
        text(
            " Prices rose.",
            CitationsWebSearchResultLocation(
                type="web_search_result_location",
                cited_text="rose",
                encrypted_index="abc",
                url="https://news.example/prices",
                title="Prices",
            ),
        ),
    )

    answer = answer_from_message(response, issued())

    assert claims_of(answer) == [
        ("Refunds take 30 days.", ("unmapped:document_index=9",)),
        ("Prices rose.", ("unmapped:web_search_result_location",)),
    ]
    assert answer.claims[0].quotes == ()
    assert answer.citations == ()


def test_whitespace_and_punctuation_are_not_claims() -> None:
    response = message(
        text("\n\n"), text("Refunds take 30 days.", char_location(0, "Refunds")), text(" … — .\n")
    )

    assert claims_of(answer_from_message(response, issued())) == [
        ("Refunds take 30 days.", ("cit_0",))
    ]


def test_leaked_cite_markup_is_parsed_where_it_maps_and_never_kept_as_text() -> None:
    response = message(
        text(
            'Refunds are issued (cite index="0-0,3-1">within 30 days</cite>. '
            '<cite index="2-0">返金は三十日以内。</cite> '
            '(cite index="7-0">Credit never expires</cite>. '
            '(cite index="zero">Gift cards lapse</cite>. '
            'Receipts (cite index="3-0">are needed'
        )
    )

    answer = answer_from_message(response, issued())

    assert claims_of(answer) == [
        ("Refunds are issued within 30 days.", ("cit_0", "cit_3")),
        ("返金は三十日以内。", ("cit_2",)),
        ("Credit never expires.", ()),
        ("Gift cards lapse.", ()),
        ("Receipts are needed", ()),
    ]
    assert "cite" not in answer.text


def test_a_claude_refusal_with_no_text_is_a_refusal() -> None:
    answer = answer_from_message(message(stop_reason="refusal"), issued())

    assert answer.refusal
    assert answer.claims == ()


def test_a_claude_message_with_no_text_is_an_answer_with_no_claims() -> None:
    answer = answer_from_message(message(), issued())

    assert (answer.refusal, answer.claims) == (False, ())


# OpenAI ---------------------------------------------------------------------------------------

FILES = ["file-refunds", "file-famille", "file-henkin", "file-exchanges"]


def file_citation(file_id: str, index: int) -> AnnotationFileCitation:
    return AnnotationFileCitation(
        type="file_citation", file_id=file_id, filename=f"{file_id}.txt", index=index
    )


def openai_response(*output: Any) -> Response:
    return Response(
        id="resp_01",
        object="response",
        created_at=1_793_000_000.0,
        model="gpt-5.2",
        output=list(output),
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
    )


def output_message(*content: Any) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_01", type="message", role="assistant", status="completed", content=list(content)
    )


def output_text(value: str, *annotations: Any) -> ResponseOutputText:
    return ResponseOutputText(type="output_text", text=value, annotations=list(annotations))


GPT_TEXT = "Refunds are issued within 30 days. Exchanges need a receipt. Gift cards never lapse."


def gpt_answer(*, file_ids: Sequence[str] = ("file-refunds", "file-exchanges")) -> Response:
    """File search results in the run's order, then an answer citing two of them."""
    first, second = file_ids
    return openai_response(
        ResponseFileSearchToolCall(
            id="fs_01",
            type="file_search_call",
            status="completed",
            queries=["refund time"],
            results=[FileSearchResult(file_id=f, filename=f"{f}.txt", score=0.5) for f in FILES],
        ),
        output_message(
            output_text(
                GPT_TEXT,
                file_citation(first, GPT_TEXT.index(" Exchanges")),
                file_citation(second, GPT_TEXT.index(" Gift")),
                AnnotationFilePath(type="file_path", file_id="file-chart", index=0),
            )
        ),
    )


def test_openai_file_citations_rest_the_sentence_they_close_on_the_file() -> None:
    answer = answer_from_response(gpt_answer(), issued())

    assert claims_of(answer) == [
        ("Refunds are issued within 30 days.", ("cit_0",)),
        ("Exchanges need a receipt.", ("cit_3",)),
        ("Gift cards never lapse.", ()),
    ]
    assert [c.citation_id for c in answer.citations] == ["cit_0", "cit_3"]


def test_openai_files_may_be_mapped_by_the_caller_in_order_or_by_index() -> None:
    response = gpt_answer(file_ids=("vs-a", "vs-b")).model_dump()
    by_order = answer_from_response(response, issued(), files=["vs-b", "x", "vs-a"])
    by_index = answer_from_response(response, issued(), files={"vs-a": 1, "vs-b": 3})

    assert claims_of(by_order)[:2] == [
        ("Refunds are issued within 30 days.", ("cit_2",)),
        ("Exchanges need a receipt.", ("cit_0",)),
    ]
    assert claims_of(by_index)[:2] == [
        ("Refunds are issued within 30 days.", ("cit_1",)),
        ("Exchanges need a receipt.", ("cit_3",)),
    ]


def test_openai_citations_outside_the_run_are_ids_the_answer_does_not_carry() -> None:
    value = "Prices rose. Refunds take 30 days."
    response = openai_response(
        output_message(
            output_text(
                value,
                AnnotationURLCitation(
                    type="url_citation",
                    url="https://news.example",
                    title="News",
                    start_index=0,
                    end_index=11,
                ),
                file_citation("file-unknown", len(value)),
            )
        )
    )

    assert claims_of(answer_from_response(response, issued(), files=FILES)) == [
        ("Prices rose.", ("unmapped:url_citation",)),
        ("Refunds take 30 days.", ("unmapped:file_id=file-unknown",)),
    ]


def test_an_openai_refusal_is_a_refusal() -> None:
    response = openai_response(
        output_message(ResponseOutputRefusal(type="refusal", refusal="I can't help with that."))
    )

    answer = answer_from_response(response, issued(), files=FILES)

    assert answer.refusal
    assert answer.claims == ()


# Cohere ---------------------------------------------------------------------------------------

COMMAND_TEXT = "Refunds are issued within 30 days. Exchanges need a receipt 🧾. Credit is forever."


def document_source(source_id: str) -> cohere.DocumentSource:
    return cohere.DocumentSource(type="document", id=source_id, document={"id": source_id})


def cited_span(
    words: str, *sources: Any, start: int | None = None, within: str = COMMAND_TEXT
) -> cohere.Citation:
    begin = within.index(words) if start is None else start
    return cohere.Citation(
        start=begin,
        end=begin + len(words),
        text=words,
        sources=list(sources),
        type="TEXT_CONTENT",
    )


def command_answer(*citations: cohere.Citation, said: str = COMMAND_TEXT) -> cohere.V2ChatResponse:
    return cohere.V2ChatResponse(
        id="chat_01",
        finish_reason="COMPLETE",
        message=cohere.AssistantMessageResponse(
            role="assistant",
            content=[cohere.TextAssistantMessageResponseContentItem(type="text", text=said)],
            citations=list(citations),
        ),
    )


def test_cohere_spans_rest_their_sentences_on_their_sources() -> None:
    response = command_answer(
        cited_span("within 30 days.", document_source("doc:0")),
        cited_span("a receipt 🧾", document_source("doc_3"), document_source("doc:0:1")),
    )

    answer = answer_from_chat(response, issued())

    assert claims_of(answer) == [
        ("Refunds are issued within 30 days.", ("cit_0",)),
        ("Exchanges need a receipt 🧾.", ("cit_3", "cit_1")),
        ("Credit is forever.", ()),
    ]
    assert answer_from_chat(response.model_dump(), issued()) == answer


def test_cohere_sources_may_be_the_runs_citation_ids() -> None:
    response = command_answer(
        cited_span("within 30 days.", document_source("cit_2")),
        cited_span("Credit is forever.", document_source("policy-v1"), document_source("doc:9")),
    )

    assert claims_of(answer_from_chat(response, issued())) == [
        ("Refunds are issued within 30 days.", ("cit_2",)),
        ("Exchanges need a receipt 🧾.", ()),
        ("Credit is forever.", ("unmapped:source=policy-v1", "unmapped:document=9")),
    ]


def test_cohere_offsets_that_miss_their_text_use_the_nearest_occurrence() -> None:
    # Offsets counted in UTF-16 units land one past the emoji; the cited words locate the span.
    receipt = COMMAND_TEXT.index("Credit")
    response = command_answer(cited_span("Credit", document_source("doc:1"), start=receipt + 1))

    assert claims_of(answer_from_chat(response, issued()))[2] == ("Credit is forever.", ("cit_1",))


def test_cohere_thinking_citations_are_not_the_answers() -> None:
    thinking = cohere.Citation(
        start=0, end=7, text="Refunds", sources=[document_source("doc:0")], type="THINKING_CONTENT"
    )

    assert claims_of(answer_from_chat(command_answer(thinking), issued()))[0][1] == ()


# Sentences ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "sentences"),
    [
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        ('He said "yes." Then left.', ['He said "yes."', "Then left."]),
        ("Version 2.5 ships.", ["Version 2.5 ships."]),
        ("返金は三十日。交換は領収書が必要\uff01", ["返金は三十日。", "交換は領収書が必要\uff01"]),
        ("- first item\n- second item", ["- first item", "- second item"]),
        ("  ...  \n\n ", []),
        ("Famille 👨‍👩‍👧 heureuse. Café\u0301.", ["Famille 👨‍👩‍👧 heureuse.", "Café\u0301."]),
    ],
)
def test_text_splits_into_sentences(value: str, sentences: list[str]) -> None:
    assert [value[s:e] for s, e in sentence_spans(value)] == sentences


def test_a_mark_over_a_sentence_boundary_cites_both_sentences() -> None:
    answer = AnswerText()
    answer.add("One fact. ")
    start, _ = answer.add("Two")
    _, end = answer.add(" facts. Three facts.")
    answer.mark(start - 4, end - 13, ["cit_a"])

    assert [(c.text, c.citation_ids) for c in answer.claims()] == [
        ("One fact.", ("cit_a",)),
        ("Two facts.", ("cit_a",)),
        ("Three facts.", ()),
    ]


# End to end -----------------------------------------------------------------------------------


@pytest.fixture
async def agent(client: httpx.AsyncClient, keys: Keys) -> AsyncIterator[GroundingClient]:
    """The client over the test's app, its transaction rolled back after the test."""
    secret = keys.secrets[("acme", "agent")]
    async with GroundingClient(str(client.base_url), secret, http_client=client) as agent:
        yield agent


@pytest.fixture
async def retrieved(client: httpx.AsyncClient, keys: Keys, agent: GroundingClient) -> RetrievedRun:
    await register_version(client, keys)
    return await agent.cite(results_for(policy_chunks()), query="refunds?", scope="HANDBOOK")


async def test_a_claude_answer_adapted_is_verified_grounded(
    agent: GroundingClient, retrieved: RetrievedRun
) -> None:
    response = message(
        text("According to the refund policy, "),
        text("refunds are issued within 30 days", char_location(0, CHUNKS[0].strip())),
        text(", and "),
        text("exchanges need a receipt", char_location(3, "Exchanges need a receipt 🧾.")),
        text("."),
    )

    passed = await agent.check_grounding(answer_from_message(response, retrieved), retrieved)

    assert passed.outcome == "grounded"
    assert passed.provenance == [retrieved[0].citation_id, retrieved[3].citation_id]


async def test_a_claude_answer_citing_words_its_document_lacks_is_rejected(
    agent: GroundingClient, retrieved: RetrievedRun
) -> None:
    response = message(
        text("Refunds take 60 days.", char_location(0, "Refunds are issued within 60 days.")),
        text(" Store credit never expires."),
    )

    with pytest.raises(grounding.QuoteMismatchError) as raised:
        await agent.check_grounding(answer_from_message(response, retrieved), retrieved)

    assert [v["class"] for v in raised.value.violations] == ["quote_mismatch", "uncited_claim"]
    assert raised.value.verification_id is not None


async def test_an_openai_answer_adapted_is_verified_grounded(
    agent: GroundingClient, retrieved: RetrievedRun
) -> None:
    value = "Refunds are issued within 30 days. 返金は三十日以内に行われます。"
    response = openai_response(
        output_message(
            output_text(value, file_citation(FILES[0], 34), file_citation(FILES[2], len(value)))
        )
    )

    adapted = answer_from_response(response, retrieved, files=FILES)
    passed = await agent.check_grounding(adapted, retrieved)

    assert passed.outcome == "grounded"
    assert passed.provenance == [retrieved[0].citation_id, retrieved[2].citation_id]


async def test_an_openai_answer_citing_a_file_outside_the_run_is_rejected(
    agent: GroundingClient, retrieved: RetrievedRun
) -> None:
    value = "Refunds are issued within 30 days."
    response = openai_response(
        output_message(output_text(value, file_citation("file-elsewhere", len(value))))
    )

    with pytest.raises(grounding.UngroundedCitationError) as raised:
        await agent.check_grounding(
            answer_from_response(response, retrieved, files=FILES), retrieved
        )

    assert raised.value.missing == ["unmapped:file_id=file-elsewhere"]
    assert raised.value.available == []


async def test_a_cohere_answer_adapted_is_verified_grounded(
    agent: GroundingClient, retrieved: RetrievedRun
) -> None:
    said = "Refunds are issued within 30 days, and exchanges need a receipt 🧾. 返金は三十日以内。"
    response = command_answer(
        cited_span("within 30 days", document_source("doc:0"), within=said),
        cited_span("a receipt 🧾", document_source(retrieved[3].citation_id), within=said),
        cited_span("三十日以内", document_source("doc:2"), within=said),
        said=said,
    )

    passed = await agent.check_grounding(answer_from_chat(response, retrieved), retrieved)

    assert passed.outcome == "grounded"
    assert passed.provenance == [c.citation_id for c in (retrieved[0], retrieved[3], retrieved[2])]


async def test_a_cohere_answer_with_an_uncited_sentence_is_rejected(
    agent: GroundingClient, retrieved: RetrievedRun
) -> None:
    response = command_answer(cited_span("within 30 days.", document_source("doc:0")))

    with pytest.raises(grounding.UncitedClaimError) as raised:
        await agent.check_grounding(answer_from_chat(response, retrieved), retrieved)

    assert [(v["class"], v["claim"]) for v in raised.value.violations] == [
        ("uncited_claim", 1),
        ("uncited_claim", 2),
    ]


def test_adapted_claims_are_the_cores_claims() -> None:
    answer = answer_from_message(claude_answer(), issued())

    assert all(type(claim) is Claim for claim in answer.claims)
