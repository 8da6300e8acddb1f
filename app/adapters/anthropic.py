"""Anthropic Messages API: a `Message` with cited text blocks -> a `CitedAnswer`.

The run's citations were sent to the model in order, as documents or as search results, so:

- `char_location`, `page_location` and `content_block_location` name `document_index` `i`, and
  `search_result_location` names `search_result_index` `i`: each is `citations[i]`; any other
  citation (`web_search_result_location`) names nothing of the run and is rejected as
  ungrounded;
- a citation's `cited_text` becomes a `Quote` on every claim the block is part of, so the
  service checks that those words occur in the cited span;
- the text blocks are joined in order and split into sentences (see `app.adapters`): Claude
  interleaves uncited connective text ("According to the policy, ") with cited blocks, and a
  sentence rests on the citations of every block it spans; a sentence of uncited blocks only is
  an uncited claim;
- citation markup leaked into the text, `<cite index="0-1,2-3">words</cite>` (also opened with
  `(cite`), where each index is "document-sentence", rests `words` on those documents'
  citations when every index names one of the run's; otherwise `words` are uncited. The markup
  itself, closed or not, never reaches a claim's text;
- blocks other than text (thinking, tool use) are not part of the answer; `stop_reason`
  "refusal" with no text is a refusal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.adapters.claims import (
    UNMAPPED,
    AnswerText,
    by_index,
    cited_answer,
    items,
    mapping,
    unmapped,
)
from app.grounding.models import Citation, CitedAnswer, Quote

_DOCUMENT_LOCATIONS = frozenset({"char_location", "page_location", "content_block_location"})
_CITE = re.compile(r'[<(]cite\s+index="([^"]*)"\s*>(.*?)</cite\s*>', re.DOTALL)
_STRAY_TAG = re.compile(r"[<(]/?cite\b[^>]*>")
_INDEX = re.compile(r"\s*(\d+)-\d+(?::\d+)?\s*")


def answer_from_message(message: object, citations: Sequence[Citation]) -> CitedAnswer:
    """The answer a Messages API response gives over the run's `citations`, sent in order."""
    data = mapping(message)
    answer = AnswerText()
    for block in items(data.get("content")):
        if block.get("type") != "text":
            continue
        ids: list[str] = []
        quotes: list[Quote] = []
        for cited in items(block.get("citations")):
            citation_id = _citation_id(cited, citations)
            ids.append(citation_id)
            quoted = cited.get("cited_text")
            if isinstance(quoted, str) and quoted and not citation_id.startswith(UNMAPPED):
                quotes.append(Quote(citation_id=citation_id, text=quoted))
        start = answer.length
        _add_text(answer, str(block.get("text") or ""), citations)
        answer.mark(start, answer.length, ids, quotes)
    return cited_answer(answer.claims(), citations, refused=data.get("stop_reason") == "refusal")


def _citation_id(cited: Mapping[str, Any], citations: Sequence[Citation]) -> str:
    kind = cited.get("type")
    if kind in _DOCUMENT_LOCATIONS:
        return by_index(citations, cited.get("document_index"), "document_index")
    if kind == "search_result_location":
        return by_index(citations, cited.get("search_result_index"), "search_result_index")
    return unmapped(str(kind))


def _add_text(answer: AnswerText, text: str, citations: Sequence[Citation]) -> None:
    """Append a block's text, its leaked citation markup parsed out and marked."""
    position = 0
    for found in _CITE.finditer(text):
        answer.add(_STRAY_TAG.sub("", text[position : found.start()]))
        start, end = answer.add(_STRAY_TAG.sub("", found.group(2)))
        answer.mark(start, end, _markup_ids(found.group(1), citations))
        position = found.end()
    answer.add(_STRAY_TAG.sub("", text[position:]))


def _markup_ids(index: str, citations: Sequence[Citation]) -> list[str]:
    """The citations a markup `index` names, or none unless every part names one of the run's."""
    ids: list[str] = []
    for part in index.split(","):
        parsed = _INDEX.fullmatch(part)
        if parsed is None or int(parsed.group(1)) >= len(citations):
            return []
        ids.append(citations[int(parsed.group(1))].citation_id)
    return list(dict.fromkeys(ids))
