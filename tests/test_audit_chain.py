"""The audit log's canonical JSON, without a database: the bytes every record is hashed by."""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum, StrEnum
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.audit.chain import canonical


def reference(value: Any) -> bytes:
    """What canonical JSON means: the standard library's encoder, sorted, compact, UTF-8."""

    def encode(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.astimezone(UTC).isoformat()
        if isinstance(value, bytes):
            return value.hex()
        raise TypeError(type(value).__name__)

    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=encode
    ).encode("utf-8")


class Level(IntEnum):
    HIGH = 3


class Kind(StrEnum):
    RUN = "run"


# Floats of every magnitude, the ones whose shortest form has an exponent among them.
finite_floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.builds(
        lambda mantissa, exponent: mantissa * 10.0**exponent,
        st.floats(-10, 10, allow_nan=False),
        st.integers(-12, 20),
    ),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    finite_floats,
    st.text(),
    st.sampled_from(["0.00001", "1e-7", "e-5", "0.0000"]),
    st.datetimes(timezones=st.just(UTC)),
    st.datetimes(timezones=st.just(timezone(timedelta(hours=-5)))),
    st.binary(max_size=8),
    st.just(Level.HIGH),
    st.just(Kind.RUN),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(st.text(), children, max_size=5),
        st.dictionaries(st.text(), children, max_size=3).map(OrderedDict),
    ),
    max_leaves=30,
)


@given(values)
@example({"score": 1e-05, "branches": {"b": 1e-07, "a": 9.99e-05}})
@example([1e16, 1e22, 5e-324, 1e-10, -0.0, 0.1, 2.0**53])
@example({"é": 1, "e": 2, "\U0001f600": 3, "\uffff": 4, "Z": {"\x00\x1f\u2028": "\x7f"}})
def test_canonical_json_is_the_standard_encoders_byte_for_byte(value: Any) -> None:
    assert canonical(value) == reference(value)


@given(st.dictionaries(st.integers() | st.booleans() | st.none(), st.integers(), min_size=1))
def test_keys_that_are_not_strings_are_written_as_the_standard_encoder_writes_them(
    value: dict[Any, int],
) -> None:
    try:
        expected = reference(value)
    except TypeError:  # keys of mixed types do not sort
        with pytest.raises(TypeError):
            canonical(value)
    else:
        assert canonical(value) == expected


def test_nesting_deeper_than_the_fast_encoder_goes_is_written_all_the_same() -> None:
    deep: Any = [1e-05]
    for _ in range(300):
        deep = {"next": deep}

    assert canonical(deep) == reference(deep)


def test_a_lone_surrogate_is_refused_as_the_reference_refuses_it() -> None:
    with pytest.raises(UnicodeEncodeError):
        canonical({"text": "\ud800"})


def test_what_cannot_be_written_is_refused() -> None:
    with pytest.raises(TypeError):
        canonical({"value": object()})


def test_times_are_written_in_utc() -> None:
    east = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))

    assert canonical({"at": east}) == b'{"at":"2026-01-02T01:04:05+00:00"}'
