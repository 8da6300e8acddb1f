"""OpenAI Responses API: a `Response` whose `output_text` is annotated -> a `CitedAnswer`.

A `file_citation` annotation names a file (`file_id`, `filename`) and the `index` in the text
where the citation stands, at the end of what it supports. So:

- each `file_citation` rests the sentence its `index` closes (the last sentence starting before
  it) on the run's citations of that file: `files` maps a file id to its citation's index in the
  run, or lists the file ids in the run's order (a file listed at several positions names each
  of those citations); without `files`, the order is that of the response's own
  `file_search_call` results (requested with `include=["file_search_call.results"]`); a file
  no one mapped is rejected as ungrounded;
- `url_citation` and `container_file_citation` name nothing of the run and are rejected as
  ungrounded; `file_path` is not a citation;
- the `output_text` parts of the output messages are the answer, each its own paragraph, split
  into sentences (see `app.adapters`); a `refusal` part with no text is a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.adapters.claims import AnswerText, by_index, cited_answer, items, mapping, unmapped
from app.grounding.models import Citation, CitedAnswer

Files = Mapping[str, int] | Sequence[str]
_OUTSIDE_THE_RUN = frozenset({"url_citation", "container_file_citation"})


def answer_from_response(
    response: object, citations: Sequence[Citation], *, files: Files | None = None
) -> CitedAnswer:
    """The answer a Responses API response gives over the run's `citations`."""
    data = mapping(response)
    positions = _searched_files(data) if files is None else _file_positions(files)
    answer = AnswerText()
    refused = False
    for item in items(data.get("output")):
        if item.get("type") != "message":
            continue
        for part in items(item.get("content")):
            if part.get("type") == "refusal":
                refused = True
            if part.get("type") != "output_text":
                continue
            answer.end_paragraph()
            start, end = answer.add(str(part.get("text") or ""))
            for annotation in items(part.get("annotations")):
                _mark(answer, annotation, start, end, citations, positions)
    return cited_answer(answer.claims(), citations, refused=refused)


def _mark(
    answer: AnswerText,
    annotation: Mapping[str, Any],
    start: int,
    end: int,
    citations: Sequence[Citation],
    positions: Mapping[str, list[int]],
) -> None:
    kind = annotation.get("type")
    if kind == "file_citation":
        file_id = str(annotation.get("file_id"))
        found = positions.get(file_id)
        ids = (
            [by_index(citations, i, "file_index") for i in found]
            if found
            else [unmapped(f"file_id={file_id}")]
        )
        at = _closing(answer.text, start, end, annotation.get("index"))
        answer.mark(at, at + 1, ids)
    elif kind in _OUTSIDE_THE_RUN:
        first, last = annotation.get("start_index"), annotation.get("end_index")
        if isinstance(first, int) and isinstance(last, int):
            answer.mark(start + first, start + max(last, first + 1), [unmapped(str(kind))])


def _closing(text: str, start: int, end: int, index: object) -> int:
    """The character a point citation stands after: the last non-space one before it."""
    at = start + index if isinstance(index, int) else end
    at = min(max(at, start), end)
    while at > start and text[at - 1].isspace():
        at -= 1
    return max(at - 1, start)


def _searched_files(response: Mapping[str, Any]) -> dict[str, list[int]]:
    """Each file id's positions among the response's own file search results."""
    return _file_positions(
        [
            str(result.get("file_id"))
            for call in items(response.get("output"))
            if call.get("type") == "file_search_call"
            for result in items(call.get("results"))
        ]
    )


def _file_positions(files: Files) -> dict[str, list[int]]:
    """Each file id's positions among the run's citations."""
    positions: dict[str, list[int]] = {}
    if isinstance(files, Mapping):
        for file_id, index in files.items():
            positions.setdefault(str(file_id), []).append(index)
    else:
        for index, file_id in enumerate(files):
            positions.setdefault(file_id, []).append(index)
    return positions
