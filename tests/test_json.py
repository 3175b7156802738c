"""JSON validation names the offending path and refuses what jsonb cannot hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgdurable import _json


@pytest.mark.parametrize(
    ("value", "exc", "where"),
    [
        ({"a": {1, 2}}, TypeError, "state['a']"),
        ({"a": [1, math.nan]}, ValueError, "state['a'][1]"),
        ({"a": math.inf}, ValueError, "state['a']"),
        ({"a": "x\x00y"}, ValueError, "state['a']"),
        ({1: "int key"}, TypeError, "key 1"),
        ({"o": object()}, TypeError, "state['o']"),
        ({"t": (1, 2)}, TypeError, "state['t']"),
        ({"b": b"bytes"}, TypeError, "state['b']"),
    ],
)
def test_non_json_is_refused_with_its_path(value: Any, exc: type[Exception], where: str) -> None:
    with pytest.raises(exc) as info:
        _json.dumps(value, "state")
    assert where in str(info.value)


def test_circular_and_oversized_values_are_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="circular"):
        _json.dumps(loop)
    with pytest.raises(ValueError, match="limit"):
        _json.dumps("x" * 100, max_bytes=10)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text().filter(lambda s: "\x00" not in s),
    lambda inner: st.lists(inner) | st.dictionaries(st.text().filter(lambda s: "\x00" not in s), inner),
    max_leaves=20,
)


@given(json_values)
def test_plain_json_round_trips(value: Any) -> None:
    assert _json.loads(_json.dumps(value)) == value
