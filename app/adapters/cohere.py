"""Cohere v2 Chat: a `ChatResponse` with `message.citations` -> a `CitedAnswer`.

Cohere cites spans of its own reply: each citation has `start` and `end` (code point offsets
into the text item `content_index` names, the first by default), the reply's `text` there, and
the `sources` that support it. So:

- each sentence (see `app.adapters`) rests on the sources of every citation overlapping it;
  where `start`/`end` do not frame the citation's `text`, the occurrence of that text nearest
  `start` is used, and failing that the offsets as given;
- a source names one of the run's citations by its `id` (or its document's or tool output's
  `id`): an id that is one of the run's citation ids names it (documents sent as
  `{"id": citation_id, "data": ...}`); Cohere's own `doc_<i>`, `doc:<i>` or `doc:<call>:<i>`
  names `citations[i]` (documents sent in the run's order); anything else is rejected as
  ungrounded;
- citations of thinking or plan text are not part of the answer; Cohere has no refusal signal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.adapters.claims import AnswerText, by_index, cited_answer, items, mapping, unmapped
from app.grounding.models import Citation, CitedAnswer

_DOCUMENT_ID = re.compile(r"doc[_:](?:\d+:)?(\d+)")


def answer_from_chat(response: object, citations: Sequence[Citation]) -> CitedAnswer:
    """The answer a v2 chat response gives over the run's `citations`."""
    message = mapping(mapping(response).get("message"))
    answer = AnswerText()
    texts: dict[int, tuple[int, str]] = {}
    for position, item in enumerate(items(message.get("content"))):
        if item.get("type") == "text":
            text = str(item.get("text") or "")
            answer.end_paragraph()
            texts[position] = (answer.add(text)[0], text)
    issued = {citation.citation_id for citation in citations}
    for cited in items(message.get("citations")):
        if cited.get("type") not in (None, "TEXT_CONTENT"):
            continue
        found = texts.get(_int(cited.get("content_index"), 0))
        if found is None:
            continue
        base, text = found
        start, end = _span(cited, text)
        ids = [_source_id(source, citations, issued) for source in items(cited.get("sources"))]
        answer.mark(base + start, base + end, ids)
    return cited_answer(answer.claims(), citations)


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _span(cited: Mapping[str, Any], text: str) -> tuple[int, int]:
    start, end = _int(cited.get("start"), 0), _int(cited.get("end"), 0)
    words = cited.get("text")
    if not isinstance(words, str) or not words or text[start:end] == words:
        return start, end
    found = [m.start() for m in re.finditer(re.escape(words), text)]
    if not found:
        return start, end
    nearest = min(found, key=lambda at: abs(at - start))
    return nearest, nearest + len(words)


def _source_id(source: Mapping[str, Any], citations: Sequence[Citation], issued: set[str]) -> str:
    inner = mapping(source.get("document") or source.get("tool_output"))
    candidates = [str(source.get("id") or ""), str(inner.get("id") or "")]
    for candidate in candidates:
        if candidate in issued:
            return candidate
    for candidate in candidates:
        numbered = _DOCUMENT_ID.fullmatch(candidate)
        if numbered is not None:
            return by_index(citations, int(numbered.group(1)), "document")
    return unmapped(f"source={candidates[0] or source.get('type')}")
