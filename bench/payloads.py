"""Request bodies of the measured operations, and the corpus text they and the seed are made of.

The text mixes ASCII with combining marks, CJK and emoji (a ZWJ sequence among them), so code
point, UTF-8 and UTF-16 offsets differ as they do in a real multilingual corpus.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

WORDS = (
    "refunds",
    "are",
    "issued",
    "within",
    "thirty",
    "days",
    "of",
    "the",
    "request",
    "policy",
    "customer",
    "receipt",
    "exchange",
    "warranty",
    "shipping",
    "order",
    "invoice",
    "support",
    "cafe\u0301",
    "re\u0301sume\u0301",
    "naïve",
    "返金は三十日以内に行われます",
    "領収書",
    "🧾",
    "👨‍👩‍👧",
    "Straße",
    "déjà",
    "vu",
)

BRANCHES = {"bm25": 11.2, "vector": 0.79, "rerank": 0.93}


def paragraph(rng: random.Random, length: int) -> str:
    """About `length` code points of sentences drawn from `WORDS`."""
    words: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return (" ".join(words)).capitalize()[: max(1, length - 2)] + ". "


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """A registered chunk as a retrieval result names it."""

    document_id: str
    version: str
    chunk_id: str
    start: int
    end: int


def register_body(*, chunks: int = 200, text_bytes: int = 200_000) -> dict[str, Any]:
    """A version of about `text_bytes` of UTF-8 text cut into `chunks` chunks; `version` unset."""
    rng = random.Random(200)
    per_chunk = text_bytes // chunks + 1
    parts: list[str] = []
    for _ in range(chunks):
        part = ""
        while len(part.encode("utf-8")) < per_chunk:
            part += paragraph(rng, 200)
        parts.append(part)
    described, start = [], 0
    for i, part in enumerate(parts):
        described.append(
            {
                "chunk_id": f"c{i:04d}",
                "start": start,
                "end": start + len(part),
                "page": i // 4 + 1,
                "section": f"Section {i // 20 + 1}",
            }
        )
        start += len(part)
    return {
        "version": "",
        "text": "".join(parts),
        "uri": "https://handbook/bench",
        "title": "Benchmark handbook",
        "chunks": described,
    }


def run_body(chunks: Sequence[ChunkSpan]) -> dict[str, Any]:
    """`POST /v1/runs`: one retrieval result per chunk, as the retriever returned it."""
    return {
        "query": "how long do refunds take?",
        "scope": "HANDBOOK",
        "results": [
            {
                "document_id": c.document_id,
                "version": c.version,
                "chunk_id": c.chunk_id,
                "start": c.start,
                "end": c.end,
                "score": round(0.95 - i / 100, 4),
                "branches": BRANCHES,
            }
            for i, c in enumerate(chunks)
        ],
    }


def answer_body(
    citations: Sequence[dict[str, Any]], *, claims: int = 10, reject: bool = False
) -> dict[str, Any]:
    """An answer of `claims` claims over the run's `citations` as issued, each cited once.

    Rejected, the last claim also names an id the answer does not carry (`ungrounded_citation`).
    """
    ids = [c["citation_id"] for c in citations]
    per_claim = max(1, len(ids) // claims)
    made = [
        {
            "text": f"Claim {i}: refunds are issued within {i + 1} days.",
            "citation_ids": ids[i * per_claim : (i + 1) * per_claim] or ids[-1:],
        }
        for i in range(claims)
    ]
    if reject:
        made[-1]["citation_ids"] = [*made[-1]["citation_ids"], "cit_not_carried_by_the_answer"]
    return {"claims": made, "citations": list(citations), "refusal": False}


def resolve_body(citation_ids: Sequence[str]) -> dict[str, Any]:
    """`POST /v1/citations/resolve` for these ids."""
    return {"citation_ids": list(citation_ids)}
