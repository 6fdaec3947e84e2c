"""The gateway's body reader (pure): orjson's reading is taken only where it is exactly the
strict reader's, and the nesting bound is measured as the REST API measures it."""

from __future__ import annotations

import codecs
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_app.gateway.body import (
    FAST_MAX_BYTES,
    KnownBodies,
    TooDeep,
    read_after,
    remember,
)
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


# --- reading only what a conversation adds (body.Known, read_after, KnownBodies) --------------

messages_st = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool"]), "content": json_values}
    ),
    min_size=1,
    max_size=6,
)
members_st = st.dictionaries(
    st.sampled_from(["model", "stream", "tools", "stop", "system", "x]", '"', "m\\"]),
    json_values,
    max_size=3,
)
formats = st.sampled_from(
    [
        {"separators": (",", ":")},
        {},  # json.dumps's default ", " and ": "
        {"indent": 2},
        {"separators": (" ,  ", " :\n")},
    ]
)


def _encode(value: Any, style: dict[str, Any], ascii_only: bool = False) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only, **style).encode("utf-8", "surrogatepass")


def _later(known: Any, raw: bytes) -> Any:
    reading = read_after(raw, known, max_depth=MAX_JSON_DEPTH)
    return None if reading is None else reading.value


def _reads_back(known: Any) -> bool:
    """Each of a known body's offsets is where its array holds that many messages."""
    return all(
        same(
            fast_loads(known.raw[:offset] + b"]}"),
            {**known.members, known.key: known.items[:count]},
        )
        for offset, count in known.bounds
    )


@settings(max_examples=300, deadline=None)
@given(
    before=members_st,
    history=messages_st,
    added=messages_st,
    after_first=members_st,
    after_next=members_st,
    style=formats,
    ascii_only=st.booleans(),
)
def test_it_reads_a_conversation_s_next_body_as_reading_it_whole_does(
    before, history, added, after_first, after_next, style, ascii_only
):
    # Any members before and after the array (a later one may repeat an earlier one), any
    # formatting, any messages: what a reading of the added part gives is the whole reading.
    first = {**before, "messages": history, **after_first}
    raw = _encode(first, style, ascii_only)
    value = fast_loads(raw)
    if value is None:
        return
    known = remember(raw, value, "messages")
    nxt = _encode({**before, "messages": history + added, **after_next}, style, ascii_only)
    whole = fast_loads(nxt)
    if known is None or whole is None:
        return
    assert _reads_back(known)
    reading = read_after(nxt, known, max_depth=MAX_JSON_DEPTH)
    if reading is None:
        return
    assert same(reading.value, whole)
    # And the next one, from what that call read.
    chained = remember(nxt, reading.value, "messages", reading=reading)
    third = _encode(
        {**before, "messages": history + added + added, **after_first}, style, ascii_only
    )
    if chained is None or fast_loads(third) is None:
        return
    assert _reads_back(chained)
    last = _later(chained, third)
    assert last is None or same(last, fast_loads(third))


def _chat(count: int, **more: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "messages": [
            {"role": "user" if i % 2 else "assistant", "content": f"message {i} [see] {{x}}"}
            for i in range(count)
        ],
        **more,
    }


def test_it_reads_only_what_follows_the_known_messages():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"enum": [[1], [2]]}}}]
    raw = json.dumps(_chat(40, tools=tools)).encode()
    known = remember(raw, fast_loads(raw), "messages")
    assert known is not None
    nxt = json.dumps(_chat(42, tools=tools, stream=True)).encode()
    later = _later(known, nxt)
    assert same(later, json.loads(nxt))
    # The messages already read are the same objects; the object and array are the call's own.
    assert later["messages"][0] is known.items[0]
    assert later["messages"] is not known.items
    later["messages"].append("changed by a caller")
    assert len(known.items) == 40


@pytest.mark.parametrize(
    "raw",
    [
        # An earlier message changed (a client editing its history): read whole.
        json.dumps({**_chat(42), "messages": [{"role": "user", "content": "edited"}]}).encode(),
        # A second array under the same key after the first: the last one wins, read whole.
        json.dumps(_chat(42))[:-1].encode() + b', "messages": [{"role": "user"}]}',
        # Bytes no reader accepts after the known part: the whole reading decides.
        json.dumps(_chat(41))[:-2].encode() + b', {"role": NaN}]}',
        json.dumps(_chat(41))[:-2].encode() + b', {"role": "\\ud800"}]}',
        # A wide integer in what was added: only the exact reader keeps it whole.
        json.dumps(_chat(41))[:-2].encode() + b', {"n": 123456789012345678901234}]}',
        b"[]",
    ],
)
def test_it_leaves_a_body_that_does_not_continue_the_known_one_to_a_whole_reading(raw):
    first = json.dumps(_chat(40)).encode()
    known = remember(first, fast_loads(first), "messages")
    assert known is not None
    assert _later(known, raw) is None


def test_it_refuses_too_deep_a_body_from_what_was_added():
    first = json.dumps(_chat(40)).encode()
    known = remember(first, fast_loads(first), "messages")
    deep = json.dumps(_chat(40))[:-2].encode() + b", " + json.dumps(nested(63)).encode() + b"]}"
    with pytest.raises(TooDeep):
        _later(known, deep)
    fits = json.dumps(_chat(40))[:-2].encode() + b", " + json.dumps(nested(62)).encode() + b"]}"
    assert same(_later(known, fits), json.loads(fits))


@pytest.mark.parametrize(
    "value",
    [
        {"messages": []},  # nothing to reuse
        {"messages": "text"},  # Responses' input may be a string
        {"model": "m"},
        [{"messages": [1]}],
    ],
)
def test_it_remembers_nothing_of_a_body_without_messages_to_reuse(value):
    raw = json.dumps(value).encode()
    assert remember(raw, fast_loads(raw), "messages") is None


def test_it_remembers_nothing_when_an_earlier_member_is_repeated_after_the_messages():
    # The first reading's "model" is the later one; a body that drops it keeps the earlier.
    raw = b'{"model": "a", "messages": [{"role": "user"}], "model": "b"}'
    assert remember(raw, fast_loads(raw), "messages") is None


def _known(size: int, text: str = "x") -> Any:
    raw = json.dumps({"messages": [{"content": text * size}]}).encode()
    known = remember(raw, fast_loads(raw), "messages")
    assert known is not None
    return known


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_it_keeps_the_conversations_that_fit_and_lets_idle_ones_make_room():
    clock = Clock()
    size = _known(1000).size
    kept = KnownBodies(max_bytes=3 * size, per_key=1, idle_seconds=60, clock=clock)
    for name in "abc":
        kept.keep(name, _known(1000, name))
    # More conversations than fit: the newcomer waits, the active ones keep theirs (recency
    # alone would evict, in a round of four, the one that calls next).
    kept.keep("d", _known(1000, "d"))
    assert kept.kept_bytes <= 3 * size
    assert [known.items[0]["content"][0] for known in kept] == ["a", "b", "c"]
    clock.now = 30
    kept.keep("b", _known(1000, "B"))  # b is active
    clock.now = 70
    kept.keep("d", _known(1000, "d"))  # a and c idle for 70 s: the least recent (a) goes
    assert sorted(known.items[0]["content"][0] for known in kept) == ["B", "c", "d"]
    assert kept.kept_bytes <= 3 * size


def test_it_keeps_a_conversation_s_last_bodies_and_reads_from_any_of_them():
    kept = KnownBodies(max_bytes=1 << 20, per_key=2)
    bodies = [json.dumps(_chat(count)).encode() for count in (10, 12, 14)]
    for raw in bodies:
        kept.keep("conversation", remember(raw, fast_loads(raw), "messages"))
    assert len(list(kept)) == 2
    # The client changed its last message (a moved cache breakpoint): the older body serves.
    changed = _chat(16)
    changed["messages"][13]["cache_control"] = {"type": "ephemeral"}
    raw = json.dumps(changed).encode()
    reading = kept.read("conversation", raw, max_depth=MAX_JSON_DEPTH)
    assert same(reading.value, json.loads(raw))
    assert reading.count == 12  # the messages the older body held
    assert kept.read("someone else", raw, max_depth=MAX_JSON_DEPTH) is None
    assert kept.kept_bytes == sum(known.size for known in kept)


def test_it_keeps_nothing_with_no_room():
    kept = KnownBodies(max_bytes=0)
    kept.keep("conversation", _known(10))
    assert list(kept) == [] and kept.kept_bytes == 0


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def test_it_reads_a_conversation_call_after_call_from_what_it_read_last():
    # Each call adds two messages and moves the cache breakpoint to its last message, as
    # Claude Code does: every call after the first reads from the one before, up to the
    # message before the breakpoint moved.
    kept = KnownBodies(max_bytes=1 << 20, per_key=1)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start [x] {y}"}]
    counts = []
    for turn in range(6):
        for message in messages:
            message.pop("cache_control", None)
        messages = [
            *messages,
            {"role": "assistant", "content": f"Re: {turn}"},
            {"role": "user", "content": f"turn {turn}", "cache_control": {"type": "ephemeral"}},
        ]
        raw = _compact({"model": "m", "messages": messages, "tools": [{"name": "f"}]})
        reading = kept.read("c", raw, max_depth=MAX_JSON_DEPTH)
        value = fast_loads(raw) if reading is None else reading.value
        assert same(value, json.loads(raw))
        counts.append(None if reading is None else reading.count)
        known = remember(raw, value, "messages", reading=reading)
        assert known is not None and _reads_back(known)
        kept.keep("c", known)
    # The first is read whole; each later one up to the last message of the one before.
    assert counts == [None, 2, 4, 6, 8, 10]


@pytest.mark.parametrize(
    ("first", "later"),
    [
        # A member repeated after the array: its first array's bracket, followed by the same
        # names, must not pass for the messages' end.
        (
            b'{"messages":[{"role":"user"}],"a":[1],"a":[2]}',
            b'{"messages":[{"role":"user"}],"a":[1,5],"b":2}',
        ),
        (
            b'{"a":[0],"messages":[{"m":1}],"a":[{"m":1}]}',
            b'{"a":[0],"messages":[{"m":1}],"a":[{"m":1},7]}',
        ),
        (
            b'{"a":[0],"messages":[{"m":1}],"a":[{"m":1}],"z":1}',
            b'{"a":[0],"messages":[{"m":1}],"a":[{"m":1},7],"z":1}',
        ),
    ],
)
def test_it_reads_a_body_with_repeated_members_exactly(first, later):
    known = remember(first, fast_loads(first), "messages")
    if known is not None:
        assert _reads_back(known)
        value = _later(known, later)
        assert value is None or same(value, json.loads(later))


# --- retries and edited histories (issue 42's slow path) --------------------------------------


def test_it_knows_every_message_end_of_a_body_written_as_orjson_writes_it():
    raw = _compact(_chat(40, tools=[{"type": "function"}]))
    known = remember(raw, fast_loads(raw), "messages")
    assert known is not None and len(known.offsets) == 40
    for index, end in enumerate(known.offsets):
        upto = fast_loads(known.raw[:end] + b"]}")
        assert upto["messages"] == known.items[: index + 1]
    # A retry: read from the array's end, nothing added.
    reading = read_after(raw, known, max_depth=MAX_JSON_DEPTH)
    assert reading.count == 40 and reading.added == []
    assert same(reading.value, json.loads(raw))
    # Not the compact writing: the two bounds only, as before.
    spaced = json.dumps(_chat(40)).encode()
    assert not remember(spaced, fast_loads(spaced), "messages").offsets


def test_it_reads_an_edited_history_from_its_first_edit():
    """Old tool results cleared (Claude Code's microcompaction): the body differs some messages
    before its end; the messages before the first difference are not read again."""
    first = _chat(40)
    raw = _compact(first)
    known = remember(raw, fast_loads(raw), "messages")
    edited = _chat(42)
    edited["messages"][31]["content"] = "[Old tool result content cleared]"
    edited["messages"][35]["content"] = "[Old tool result content cleared]"
    nxt = _compact(edited)
    reading = read_after(nxt, known, max_depth=MAX_JSON_DEPTH)
    assert reading is not None and reading.count == 31
    assert same(reading.value, json.loads(nxt))
    assert reading.value["messages"][0] is known.items[0]
    # And the next call, from what this one read.
    chained = remember(nxt, reading.value, "messages", reading=reading)
    assert chained is not None and len(chained.offsets) == 42
    assert _reads_back(chained)
    third = _compact({**edited, "messages": edited["messages"] + _chat(2)["messages"]})
    again = read_after(third, chained, max_depth=MAX_JSON_DEPTH)
    assert again.count == 42 and same(again.value, json.loads(third))


@settings(max_examples=150, deadline=None)
@given(
    history=messages_st,
    edit=st.integers(min_value=0, max_value=6),
    replacement=messages_st,
    added=st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": json_values})),
    retry=st.booleans(),
)
def test_it_reads_any_edit_or_retry_as_reading_it_whole_does(
    history, edit, replacement, added, retry
):
    messages = history[:edit] + replacement + history[edit + 1 :] + added
    try:  # the bodies as orjson writes them (a 64-bit overflow it cannot write: skipped)
        raw = orjson.dumps({"model": "m", "messages": history, "stream": False})
        nxt = raw if retry else orjson.dumps({"model": "m", "messages": messages, "stream": 1})
    except TypeError:
        return
    known = remember(raw, fast_loads(raw) or {}, "messages")
    if known is None:
        return
    whole = fast_loads(nxt)
    reading = read_after(nxt, known, max_depth=MAX_JSON_DEPTH)
    if reading is None or whole is None:
        return
    assert same(reading.value, whole)
    chained = remember(nxt, reading.value, "messages", reading=reading)
    if chained is not None:
        assert _reads_back(chained)
        for index, end in enumerate(chained.offsets):
            assert fast_loads(chained.raw[:end] + b"]}")["messages"] == chained.items[: index + 1]


def test_it_counts_what_a_known_body_holds_in_memory():
    """Issue 42, row 7: 100 conversations each with one 1 MB body took resident memory from
    853 to 2,428 MB, about 23x the bytes the budget counted. The budget now counts what the
    parsed messages take too, bounded from above (measured with tracemalloc here)."""
    import tracemalloc

    shapes = {
        "an agent's messages": _chat(2000),
        "one-key objects": {"messages": [{"a": 1} for _ in range(20000)]},
        "short parts": {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "ab"}] * 50}
                for _ in range(300)
            ]
        },
        "non-ascii": {"messages": [{"role": "user", "content": "é" * 200} for _ in range(500)]},
    }
    for name, body in shapes.items():
        raw = orjson.dumps(body)
        tracemalloc.start()
        value = orjson.loads(raw)
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        known = remember(raw, value, "messages")
        assert known is not None
        assert known.size >= len(raw) + held, (name, known.size, len(raw) + held)
        assert known.size <= 3 * (len(raw) + held), (name, known.size, len(raw) + held)
