"""The gateway's body reader (pure): orjson's reading is taken only where it is exactly the
strict reader's, and the nesting bound is measured as the REST API measures it."""

from __future__ import annotations

import codecs
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_app.gateway.body import FAST_MAX_BYTES, TooDeep
from compaction_app.gateway.body import fast_loads as read_fast
from sessions_app.api.parsers import MAX_JSON_DEPTH, strict_loads
from sessions_app.json_depth import nests_deeper

pytestmark = pytest.mark.profile_independent


def fast_loads(raw: bytes) -> Any:
    return read_fast(raw, max_depth=MAX_JSON_DEPTH)


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down and the same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (a != a and b != b)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(value=json_values, ascii_only=st.booleans())
def test_it_reads_a_body_exactly_as_the_strict_reader_or_leaves_it_to_it(value, ascii_only):
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    exact = strict_loads(raw, finite=False)
    fast = fast_loads(raw)
    assert fast is None or same(fast, exact)


@pytest.mark.parametrize(
    "raw",
    [
        codecs.BOM_UTF8 + b'{"a": 1}',  # a byte-order mark: json.loads(bytes) skips it
        b'{"a": "\\ud800"}',  # a lone surrogate, escaped
        b'{"a": "\xed\xa0\x80"}',  # a lone surrogate, encoded (surrogatepass)
        b'{"a": 1e400}',  # past a double's range: read as an OutOfRangeNumber
        b'{"a": 12345678901234567890123}',  # past 64 bits: orjson would make it a float
        b'{"a": -9300000000000000000}',
        b'[[[{"a": [18446744073709551616]}]]]',  # 2**64, nested
        b"99999999999999999999",
        b'{"a": NaN}',
        b'{"a": "\x00"}',  # a raw control character
        '{"a": 1}'.encode("utf-16"),
        b"[" * 2000 + b"]" * 2000,  # deeper than orjson's own limit
        b'{"a": 1e19}',  # a float past 2**63: read by the exact reader, alike
    ],
)
def test_it_leaves_what_orjson_reads_otherwise_to_the_strict_reader(raw):
    assert fast_loads(raw) is None


def test_it_keeps_the_last_of_duplicate_keys_and_escaped_nuls_as_json_loads_does():
    raw = b'{"a": 1, "b": "x\\u0000y", "a": 2}'
    assert same(fast_loads(raw), json.loads(raw))


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value, "s": "t"}
    return value


def _too_deep(value: Any, limit: int) -> bool:
    """The reference: a walk value by value, with the depth on each (the API's own measure
    before the level walk of sessions_app/json_depth.py served both)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


@pytest.mark.parametrize("depth", [0, 1, 2, 63, 64, 65, 66, 200])
def test_it_measures_nesting_as_the_api_does(depth):
    value = nested(depth)
    assert nests_deeper(value, MAX_JSON_DEPTH) == _too_deep(value, MAX_JSON_DEPTH)
    assert nests_deeper(value, MAX_JSON_DEPTH) == (depth > MAX_JSON_DEPTH)


def test_it_measures_the_deepest_branch_among_many():
    messages = [{"role": "user", "content": "hi"}] * 500 + [{"content": nested(70)}]
    assert nests_deeper({"messages": messages}, MAX_JSON_DEPTH)
    assert not nests_deeper({"messages": messages[:-1]}, MAX_JSON_DEPTH)


def test_it_leaves_a_body_past_the_fast_bound_to_the_lean_reader():
    # orjson holds many times the body while it reads: a large body keeps the bound on
    # memory (test_gateway_large_body.py) by taking the exact reader's path.
    raw = json.dumps({"content": "x" * FAST_MAX_BYTES}).encode()
    assert fast_loads(raw) is None
    small = json.dumps({"content": "x" * (FAST_MAX_BYTES - 20)}).encode()
    assert same(fast_loads(small), json.loads(small))


def test_it_reads_64_bit_integers_itself():
    raw = b'{"a": [9223372036854775807, -9223372036854775808, 18446744073709551615]}'
    assert same(fast_loads(raw), json.loads(raw))


def test_it_refuses_too_deep_a_body_it_read():
    with pytest.raises(TooDeep):
        fast_loads(json.dumps({"messages": [nested(65)]}).encode())
    assert fast_loads(json.dumps(nested(MAX_JSON_DEPTH)).encode()) is not None
