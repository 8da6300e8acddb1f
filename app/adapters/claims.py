"""What the adapters share: text with citation marks -> sentences -> claims -> a `CitedAnswer`.

Invariants kept here:
- every character of the text belongs to at most one sentence, and a sentence rests on every
  mark that covers any of its characters, in the order the marks were made;
- a sentence with no letter or digit is not a claim; every other sentence is, cited or not;
- the answer carries exactly the run's citations that some claim names, in the run's order.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.grounding.models import AnswerCitation, Citation, CitedAnswer, Claim, Quote

# A sentence ends at `.!?…` (and any closing quotes or brackets) followed by whitespace, after a
# CJK full stop with or without whitespace, or at a line break.
_SENTENCE_END = re.compile(
    r"[.!?\u2026][\"'\u201d\u2019\u00bb)\]]*\s+"  # . ! ? … and closing quotes, then whitespace
    r"|[\u3002\uff01\uff1f][\u300d\u300f\u201d\u2019)\uff09]*\s*"  # CJK stops, then closing marks
    r"|\s*\n\s*"
)

UNMAPPED = "unmapped:"
_MAX_ID = 256


def as_data(value: object) -> Any:
    """A vendor SDK object as its plain form (`model_dump()`); plain data as it is."""
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) else value


def items(value: object) -> list[Mapping[str, Any]]:
    """The mappings in a list field that may be missing or null, each as plain data."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        return []
    return [item for item in map(as_data, value) if isinstance(item, Mapping)]


def mapping(value: object) -> Mapping[str, Any]:
    """A response (or part of one) as a mapping; anything else as an empty one."""
    data = as_data(value)
    return data if isinstance(data, Mapping) else {}


def unmapped(what: str) -> str:
    """An id for a vendor citation naming nothing of the run: no answer carries it."""
    return f"{UNMAPPED}{what}"[:_MAX_ID]


def by_index(citations: Sequence[Citation], index: object, what: str) -> str:
    """The id of the run's citation at `index`, or an unmapped id naming what was asked."""
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(citations):
        return citations[index].citation_id
    return unmapped(f"{what}={index}")


@dataclass(frozen=True, slots=True)
class Mark:
    """Citation ids (and quoted words) resting on the characters `[start, end)` of the text."""

    start: int
    end: int
    citation_ids: tuple[str, ...]
    quotes: tuple[Quote, ...] = ()


@dataclass(slots=True)
class AnswerText:
    """An answer's text as it is assembled, with the marks its citations make on it."""

    parts: list[str] = field(default_factory=list)
    length: int = 0
    marks: list[Mark] = field(default_factory=list)

    def add(self, text: str) -> tuple[int, int]:
        """Append `text`; its range in the whole."""
        start = self.length
        self.parts.append(text)
        self.length += len(text)
        return start, self.length

    def end_paragraph(self) -> None:
        """End the sentence in progress: separate parts of a response are never joined."""
        if self.length:
            self.add("\n")

    def mark(
        self,
        start: int,
        end: int,
        citation_ids: Sequence[str],
        quotes: Sequence[Quote] = (),
    ) -> None:
        """Rest the characters `[start, end)` on `citation_ids`."""
        start, end = max(start, 0), min(end, self.length)
        if end > start and citation_ids:
            self.marks.append(Mark(start, end, tuple(citation_ids), tuple(quotes)))

    @property
    def text(self) -> str:
        """The text so far."""
        return "".join(self.parts)

    def claims(self) -> list[Claim]:
        """One claim per sentence, each resting on the marks over its characters."""
        text = self.text
        claims = []
        for start, end in sentence_spans(text):
            covering = [m for m in self.marks if m.start < end and m.end > start]
            ids = dict.fromkeys(cid for m in covering for cid in m.citation_ids)
            quotes = dict.fromkeys(q for m in covering for q in m.quotes)
            claims.append(
                Claim(text=text[start:end], citation_ids=tuple(ids), quotes=tuple(quotes))
            )
        return claims


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The `[start, end)` of each sentence of `text`, without surrounding whitespace."""
    bounds = [0, *(m.end() for m in _SENTENCE_END.finditer(text)), len(text)]
    spans = []
    for start, end in itertools.pairwise(bounds):
        sentence = text[start:end]
        stripped = sentence.strip()
        if not any(ch.isalnum() for ch in stripped):
            continue
        lead = len(sentence) - len(sentence.lstrip())
        spans.append((start + lead, start + lead + len(stripped)))
    return spans


def cited_answer(
    claims: Sequence[Claim], citations: Sequence[Citation], *, refused: bool = False
) -> CitedAnswer:
    """The answer: `claims` over the run's citations they name; a refusal if `refused` and empty."""
    named = {cid for claim in claims for cid in claim.citation_ids}
    carried = tuple(
        AnswerCitation.model_validate(citation.model_dump())
        for citation in citations
        if citation.citation_id in named
    )
    return CitedAnswer(claims=tuple(claims), citations=carried, refusal=refused and not claims)
