"""Answers straight from the model APIs: a vendor's cited response -> a `CitedAnswer`.

One pure function per vendor, with no network and no vendor SDK imported:
`anthropic.answer_from_message`, `openai.answer_from_response`, `cohere.answer_from_chat`. Each
reads the response as the SDK object or its plain `model_dump()` form, with the run's citations.
The rules they share:

- The documents (or search results) the model saw were the run's citations, in order, so the
  vendor's document index `i` is `citations[i]`.
- The text is split into sentences: after `.`, `!`, `?` or an ellipsis (with any closing quotes
  or brackets) followed by whitespace; after a CJK full stop, exclamation or question mark,
  whitespace or not; and at line breaks. Each sentence is one claim, resting on every citation
  the vendor attached to any of its characters, so a sentence spanning several cited blocks
  rests on the citations of all of them.
- A sentence nothing cites becomes a claim with no citation ids, which verification rejects as
  `uncited_claim`; whitespace and punctuation with no letter or digit are not claims.
- A vendor citation that names nothing of the run (an index past its citations, a web or
  container source, a file no one mapped) becomes an id the answer does not carry, starting
  `unmapped:`, so verification rejects the claim as `ungrounded_citation` rather than the
  citation being dropped and the claim left standing on the rest.
- The answer carries the run's citations that some claim names, in the run's order, as issued.
- Only a vendor's own refusal signal, with no text, makes a refusal; no text and no such signal
  is an answer with no claims, which verification rejects.

An adapter never decides whether the answer is grounded: the service's `check_grounding` does.
"""

from app.adapters.anthropic import answer_from_message
from app.adapters.cohere import answer_from_chat
from app.adapters.openai import answer_from_response

__all__ = ["answer_from_chat", "answer_from_message", "answer_from_response"]
