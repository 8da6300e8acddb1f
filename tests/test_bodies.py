"""JSON request bodies decoded fast, without a database: always to what `json.loads` gives."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute, iter_route_contexts
from hypothesis import example, given
from hypothesis import strategies as st

from app.bodies import JSONBodyRoute, loads
from app.config import Settings
from app.main import create_app


def typed(value: Any) -> Any:
    """`value` with every scalar's type beside it: 1 and 1.0 differ, and NaN equals NaN."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else repr(value))
    return (type(value).__name__, value)


def outcome(decode: Callable[[bytes | str], Any], body: bytes | str) -> tuple[Any, ...]:
    try:
        return ("decoded", typed(decode(body)))
    except Exception as refused:
        return ("refused", type(refused), str(refused))


def decoded_alike(body: bytes | str) -> None:
    assert outcome(loads, body) == outcome(json.loads, body)


values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        # Integers at and past 64 bits, where orjson alone would give a float.
        st.integers(min_value=2**62, max_value=2**66).flatmap(lambda n: st.sampled_from([n, -n])),
        st.floats(),
        st.text(),
    ),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


@given(values, st.booleans(), st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32-le"]))
@example(2**64, True, "utf-8")
@example(-(2**63) - 1, True, "utf-8")
@example(10**30, True, "utf-8")
@example([0.1, 1e-7, 1e300, -0.0], True, "utf-8")
@example({"score": float("nan")}, True, "utf-8")
@example({"a": "\ud800"}, False, "utf-8")
def test_a_json_body_decodes_to_what_the_standard_library_gives(
    value: Any, ensure_ascii: bool, encoding: str
) -> None:
    document = json.dumps(value, ensure_ascii=ensure_ascii)
    decoded_alike(document.encode(encoding, "surrogatepass"))


@given(values, st.booleans())
@example(2**64, True)
@example({"a": "\ud800"}, False)
def test_a_json_text_decodes_to_what_the_standard_library_gives(
    value: Any, ensure_ascii: bool
) -> None:
    # As the database's jsonb reaches the engine's decoder: text, not bytes.
    decoded_alike(json.dumps(value, ensure_ascii=ensure_ascii))


@given(st.text(max_size=64))
@example("\ud800")
@example("[12345678901234567890]")
def test_any_text_decodes_or_fails_as_the_standard_library_does(text: str) -> None:
    decoded_alike(text)


@given(st.binary(max_size=64))
@example(b'{"a": 1, "a": 2}')
@example(b"[1,]")
@example(b"")
@example(b'"\xff"')
@example(b'"\x01"')
@example(b"1e400")
def test_any_bytes_decode_or_fail_as_the_standard_library_does(body: bytes) -> None:
    decoded_alike(body)


@given(st.lists(st.sampled_from([b"1", b"23", b"-", b"0", b"[", b"]", b",", b".5", b"e9"])))
def test_numbers_decode_alike(parts: list[bytes]) -> None:
    decoded_alike(b"".join(parts))


def test_every_route_with_a_body_reads_it_with_the_fast_decoder() -> None:
    # FastAPI serves an included router's routes through contexts that keep the route declared.
    routes = [
        context
        for context in iter_route_contexts(create_app(Settings()).routes)
        if isinstance(context.original_route, APIRoute) and context.body_field is not None
    ]
    assert "/v1/runs/{run_id}/answers" in [context.path for context in routes]
    assert [c.path for c in routes if not isinstance(c.original_route, JSONBodyRoute)] == []
