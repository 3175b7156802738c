"""JSON validation names the offending path and refuses what jsonb cannot hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgdurable.foundation import jsonb as _json


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
        ({"m": [{"text": "truncated \ud83d"}]}, ValueError, "state['m'][0]['text']"),
        ({"m": ["\udc00"]}, ValueError, "state['m'][0]"),
        ({"m": {"k\ud800": 1}}, ValueError, "state['m'] key 'k\\ud800'"),
        ("\udfff", ValueError, "state contains a lone surrogate"),
    ],
)
def test_non_json_is_refused_with_its_path(value: Any, exc: type[Exception], where: str) -> None:
    with pytest.raises(exc) as info:
        _json.dumps(value, "state")
    assert where in str(info.value)


def test_lone_surrogates_are_refused_but_pairs_and_astral_text_pass() -> None:
    """A lone surrogate cannot be encoded to reach jsonb: a ValueError naming
    the path (the message itself stays encodable); real astral text passes."""
    with pytest.raises(ValueError, match="lone surrogate") as info:
        _json.dumps({"reply": "ok \ud83d"}, "state")
    str(info.value).encode("utf-8")
    assert _json.loads(_json.dumps({"emoji \U0001f600": "\U0001f600"})) == {
        "emoji \U0001f600": "\U0001f600"}


def test_circular_and_oversized_values_are_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="circular"):
        _json.dumps(loop)
    with pytest.raises(ValueError, match="limit"):
        _json.dumps("x" * 100, max_bytes=10)


def test_shared_values_are_not_circular() -> None:
    """The same list or dict in two places (or twice in one list) is plain JSON;
    only a container inside itself is circular, however deep."""
    shared: list[Any] = [1, {"x": 2}]
    value = {"a": shared, "b": [shared, shared], "c": {"d": shared}}
    assert _json.loads(_json.dumps(value)) == {"a": [1, {"x": 2}], "b": [[1, {"x": 2}]] * 2,
                                               "c": {"d": [1, {"x": 2}]}}
    inner: dict[str, Any] = {}
    deep = {"k": [{"inner": inner}]}
    inner["back"] = deep
    with pytest.raises(ValueError, match=r"value\['k'\]\[0\]\['inner'\]\['back'\] is a circular"):
        _json.dumps(deep)


def test_too_deeply_nested_values_are_a_value_error() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"state is nested too deeply \(more than 512 levels\)"):
        _json.dumps(deep, "state")
    ok: Any = "leaf"
    for _ in range(_json.MAX_DEPTH):
        ok = [ok]
    assert _json.loads(_json.dumps(ok)) == ok


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text().filter(lambda s: "\x00" not in s),
    lambda inner: st.lists(inner) | st.dictionaries(st.text().filter(lambda s: "\x00" not in s), inner),
    max_leaves=20,
)


@given(json_values)
def test_plain_json_round_trips(value: Any) -> None:
    assert _json.loads(_json.dumps(value)) == value


class _Int(int):
    pass


# everything validate() must judge: plain JSON, and each kind of value it refuses
any_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    | st.sampled_from(["\x00", "a\ud800b", "\udfff", "é", (1, 2), b"x", {1, 2}, _Int(3)]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text() | st.integers() | st.sampled_from(["k\x00", "\ud800", None]),
                      inner, max_size=4),
    max_leaves=30,
)


def _refused(value: Any) -> bool:
    try:
        _json._validate(value, "v")
    except (TypeError, ValueError):
        return True
    return False


@given(any_values)
def test_the_fast_check_never_passes_what_the_close_look_refuses(value: Any) -> None:
    """validate() trusts _plain() (no path kept, exact types) and walks the
    value with its paths only when _plain() is unsure: _plain() must never
    accept a value that the walk refuses."""
    if _json._plain(value):
        assert not _refused(value)


@pytest.mark.parametrize("leaf", [[], {}, 1, "x"])
@pytest.mark.parametrize("depth", [_json.MAX_DEPTH - 1, _json.MAX_DEPTH, _json.MAX_DEPTH + 1])
def test_the_fast_check_and_the_close_look_agree_at_the_depth_limit(leaf: Any, depth: int) -> None:
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    assert _json._plain(value) == (not _refused(value))


def test_shared_and_circular_values_take_the_close_look() -> None:
    x = [1]
    shared = [x, {"again": x}]
    assert not _json._plain(shared) and not _refused(shared)  # shared: fine, looked at closely
    loop: list[Any] = []
    loop.append(loop)
    assert not _json._plain(loop) and _refused(loop)
