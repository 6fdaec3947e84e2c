"""A conversation request's body, read once and fast (pure).

The gateway reads every call's whole body on the event loop, and the body grows with the
conversation: with `json.loads` plus a Python walk for the nesting bound, reading was most of
what a 1,600-message call added (issue 31, item 5). orjson reads the same JSON in a fraction
of the time, and one walk in C iterators measures the depth and finds what orjson may have
read otherwise.

orjson is taken only where its answer is exactly `strict_loads(…, finite=False)`'s, so what
the gateway accepts, refuses, records and forwards is unchanged:

- a body over FAST_MAX_BYTES, where orjson's transient memory would break the gateway's
  bound on what a large body costs, is read the exact way;
- a body orjson refuses (a byte-order mark, a lone surrogate, NaN, a number past a double's
  range, nesting past its own limit of 1,024, invalid UTF-8, UTF-16/32, malformed JSON) goes
  to the exact reader, which gives today's value or today's error;
- orjson reads an integer past 64 bits as a float where Python keeps the int: a body whose
  value holds a float of 2**63 or more (found by the same walk that measures the nesting)
  goes to the exact reader too. Other numbers read alike (checked against `float()` on
  300,000 random decimals; `test_gateway_body.py` compares both readers on generated bodies).

Duplicate keys keep the last value in both readers.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from sessions_app.json_depth import measure

# orjson's reader holds up to about 12x the body while it reads (a tree of every value,
# sized for the worst case: measured with tracemalloc): past this size the exact reader, which
# holds the text and the value (issue 22, row 14), reads it. A 1,600-message conversation
# is 0.3 MB.
FAST_MAX_BYTES = 1 << 20


class TooDeep(ValueError):
    """The body nests arrays/objects deeper than the bound it was read with."""


def fast_loads(raw: bytes, *, max_depth: int) -> Any | None:
    """The body as `strict_loads(raw, finite=False)` reads it, or None when only that
    reader can tell (see the module's note): the caller then reads it the exact way.
    TooDeep when it nests deeper than `max_depth` (the exact reader's verdict too)."""
    if len(raw) > FAST_MAX_BYTES:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    deep, wide = measure(value, max_depth)
    if deep:
        raise TooDeep(max_depth)
    # A float this large may have been an integer Python would keep whole.
    return None if wide else value


# --- reading only what is new ------------------------------------------------------------------
#
# An agent resends its whole conversation on every call, and each call's body is the last one's
# with a few messages added: byte for byte, up to where the message array closed, or up to its
# last message (a client that moves its cache breakpoint changes that one). A body read is
# remembered (`Known`) with those offsets, each proved: the parser is there inside the
# top-level message array, after so many messages, outside any string. A later body that
# starts with the same bytes up to one of them is in the same parser state there (JSON is read
# left to right), so only what follows is read, inside a stand-in for the open object and
# array, and joined to the messages already read. The result is what reading it whole gives:
# the same values, key order and last-wins duplicates (tests/gateway/test_gateway_body.py
# compares the two on generated conversations and formattings).
#
# A body written as orjson writes it (compact, raw UTF-8: what the SDKs and CLIs send) is proved
# by writing its value again: then every message's end is known (`offsets`), and a later body
# that differs from it anywhere (a retry, with none added; a history whose old tool results
# were cleared, issue 42's slow path) is read from the last message end before the first byte
# that differs, not whole.

# Stands for the messages already read, in the tail's stand-in document. Its key is random per
# process, so no body can hold one and be mistaken for the stand-in.
_STAND_IN_KEY = f"ledger-{os.urandom(16).hex()}"
_STAND_IN = {_STAND_IN_KEY: 0}
_STAND_IN_JSON = orjson.dumps(_STAND_IN)
_WS = b" \t\r\n"


@dataclass(frozen=True)
class Known:
    """A body read before (`raw`): its top-level members before the message array
    (`members`), the array's messages (`items`), and the offsets where the parser is inside
    the array after so many of them (`bounds`: (offset, count), the array's end first).
    `offsets`, when the body is written as orjson writes it: the end of every message (the
    offset of the `,` or `]` after message i is offsets[i]). `cost`: what it holds in memory,
    the bytes and an estimate of what they parse to (`parsed_cost`).
    Never changed: a body read from it shares the messages, and builds its own top-level
    object and array."""

    raw: bytes
    key: str
    members: dict[str, Any]
    items: list[Any]
    bounds: tuple[tuple[int, int], ...]
    offsets: array[int] = field(default_factory=lambda: array("q"))
    parsed: int = 0

    @property
    def size(self) -> int:
        """What keeping it costs, in bytes of memory (KnownBodies' budget)."""
        return len(self.raw) + self.parsed + 8 * len(self.offsets)


@dataclass(frozen=True)
class Reading:
    """A body read from a known one (`source`): the value, how many of its messages the known
    body held (`count`), where the part read began (`offset`) and the messages read there
    (`added`)."""

    value: dict[str, Any]
    count: int
    offset: int
    added: list[Any]
    source: Known | None = None


# What parsed JSON holds per structural byte, at most (CPython 3.11, 64-bit): a dict with a
# few keys 184 bytes and a pointer, a list 56 and a pointer, each value 8 more (a pointer; a
# string's own object is counted with its characters). Text counts at up to 4 bytes a
# character when it is not all ASCII (a string is as wide as its widest character).
_COST_OBJECT, _COST_ARRAY, _COST_VALUE, _COST_STRING = 192, 64, 16, 56


def parsed_cost(raw: bytes | memoryview) -> int:
    """An upper bound of the memory `raw`'s parsed value takes beside `raw` itself: counted
    from its bytes in C (no walk of the value). Measured against tracemalloc: 1.3x for an
    agent's messages, 1.7x for a body of one-key objects (a parse 23x its bytes)."""
    data = bytes(raw) if isinstance(raw, memoryview) else raw
    text = len(data) * (1 if data.isascii() else 4)
    return (
        text
        + _COST_OBJECT * data.count(b"{")
        + _COST_ARRAY * data.count(b"[")
        + _COST_VALUE * (data.count(b",") + data.count(b":"))
        + _COST_STRING * (data.count(b'"') // 2)
    )


def _opening(key: str) -> bytes:
    """The stand-in for the open object and array: `{"<key>":[<stand-in>`."""
    return b"{" + orjson.dumps(key) + b":[" + _STAND_IN_JSON


def remember(raw: bytes, value: Any, key: str, *, reading: Reading | None = None) -> Known | None:
    """What a later body starting like `raw` can reuse, or None. `value` is `raw` read fast:
    whole (its array's end is then proved by reading up to it again), or from a known body
    (`reading`: only what it read is read again)."""
    if not isinstance(value, dict) or len(raw) > FAST_MAX_BYTES:
        return None
    items = value.get(key)
    if not isinstance(items, list) or not items:
        return None
    names = list(value)
    at = names.index(key)
    after = names[at + 1 :]
    compact = _compact_known(raw, value, key, names, at, reading)
    if compact is not None:
        return compact
    floor = reading.offset if reading is not None else 0
    for end in _array_ends(raw, after[0] if after else None, floor):
        # The members after the array are read back from its end: exactly the value's.
        try:
            rest = orjson.loads(_opening(key) + raw[end:])
        except orjson.JSONDecodeError:
            continue
        if list(rest) != [key, *after] or rest[key] != [_STAND_IN]:
            continue
        if any(rest[name] != value[name] for name in after):
            continue
        if not _array_ends_at(raw, end, key, items, names[:at], reading):
            continue
        members = {name: value[name] for name in names[:at]}
        # Its own list: the caller's may change; the messages in it are never changed.
        bounds = [(end, len(items))]
        before_last = _before_last(raw, end, items)
        if before_last is not None:
            bounds.append((before_last, len(items) - 1))
        return Known(
            raw=raw,
            key=key,
            members=members,
            items=list(items),
            bounds=tuple(bounds),
            parsed=_parsed_after(raw, reading),
        )
    return None


def _parsed_after(raw: bytes, reading: Reading | None) -> int:
    """The parsed cost of `raw` read from `reading` (its source's share of the prefix, counted
    again: the two bodies' costs are kept apart, a bound) or whole."""
    if reading is None or reading.source is None:
        return parsed_cost(raw)
    source = reading.source
    shared = source.parsed - parsed_cost(memoryview(source.raw)[reading.offset :])
    return max(shared, 0) + parsed_cost(memoryview(raw)[reading.offset :])


def _compact_known(
    raw: bytes,
    value: dict[str, Any],
    key: str,
    names: list[str],
    at: int,
    reading: Reading | None,
) -> Known | None:
    """`raw` as a Known with every message's end, when it is exactly what orjson writes for
    `value` (then those ends follow from the messages' own writing); None otherwise."""
    try:
        return _written_as_orjson(raw, value, key, names, at, reading)
    except (TypeError, orjson.JSONEncodeError):  # a value orjson cannot write: not its writing
        return None


def _written_as_orjson(
    raw: bytes,
    value: dict[str, Any],
    key: str,
    names: list[str],
    at: int,
    reading: Reading | None,
) -> Known | None:
    items = value[key]
    members = {name: value[name] for name in names[:at]}
    after = {name: value[name] for name in names[at + 1 :]}
    source = reading.source if reading is not None else None
    if reading is not None and source is not None and source.offsets:
        # The prefix is the source's (proved there): the part read must be written as orjson
        # writes it, from the message end it began at.
        tail = orjson.dumps({key: [_STAND_IN, *reading.added], **after})
        if _opening(key) + raw[reading.offset :] != tail:
            return None
        if reading.count == len(source.offsets):
            start = source.offsets[-1]  # after the last message: a `,` or `]` follows
        else:
            start = source.offsets[reading.count - 1]
        if reading.offset != start:
            return None
        ends = array("q", source.offsets[: reading.count])
        position = start
    elif reading is None:
        if orjson.dumps(value) != raw:
            return None
        head = orjson.dumps({**members, key: []})  # `{…,"messages":[]}`
        position = len(head) - 3  # the `[`
        ends = array("q")
    else:
        return None
    for length in map(len, map(orjson.dumps, items[len(ends) :])):
        position += 1 + length  # the `[` or `,` before the message, then the message
        ends.append(position)
    if raw[ends[-1] : ends[-1] + 1] != b"]":
        return None
    bounds = [(ends[-1], len(items))]
    if len(items) > 1:
        bounds.append((ends[-2], len(items) - 1))
    return Known(
        raw=raw,
        key=key,
        members=members,
        items=list(items),
        bounds=tuple(bounds),
        offsets=ends,
        parsed=_parsed_after(raw, reading),
    )


def _array_ends_at(
    raw: bytes,
    end: int,
    key: str,
    items: list[Any],
    member_names: list[str],
    reading: Reading | None,
) -> bool:
    """Whether the array open at `end` is the top-level `key`'s, after all its `items` (a
    bracket that closes another top-level array, repeated members around it, is not)."""
    if reading is not None:
        # The known part is proved: what lies between it and `end` must be the messages
        # read there, and nothing else.
        try:
            between = orjson.loads(b"[0" + raw[reading.offset : end] + b"]")
        except orjson.JSONDecodeError:
            return False
        return between[1:] == reading.added
    # Read whole: read up to `end` again with the stand-in appended to the open array.
    try:
        upto = orjson.loads(raw[:end] + b"," + _STAND_IN_JSON + b"]}")
    except orjson.JSONDecodeError:
        return False
    found = upto.get(key) if isinstance(upto, dict) else None
    return (
        list(upto) == [*member_names, key]
        and isinstance(found, list)
        and len(found) == len(items) + 1
        and found[-1] == _STAND_IN
    )


def _before_last(raw: bytes, end: int, items: list[Any]) -> int | None:
    """The offset of the comma before the array's last message, when the body is written as
    orjson writes it (compact, as the SDKs and CLIs send it); proved by reading it."""
    if len(items) < 2:
        return None
    text = orjson.dumps(items[-1])
    stop = _skip_back(raw, end) + 1
    comma = _skip_back(raw, stop - len(text))
    if comma < 0 or raw[comma] != ord(",") or raw[stop - len(text) : stop] != text:
        return None
    try:
        read = orjson.loads(b"[0" + raw[comma:end] + b"]")
    except orjson.JSONDecodeError:
        return None
    return comma if read == [0, items[-1]] else None


def _array_ends(raw: bytes, next_name: str | None, floor: int) -> Iterator[int]:
    """Where the top-level array may close, from the end: before the member `next_name`
    that follows it, else before the object's closing brace; not before `floor`."""
    if next_name is None:
        # Walked back byte by byte: a stripped slice would copy the whole body.
        stop = _skip_back(raw, len(raw))
        if stop < 0 or raw[stop] != ord("}"):
            return
        end = _skip_back(raw, stop)
        if end >= floor and raw[end] == ord("]"):
            yield end
        return
    name = orjson.dumps(next_name)
    found = len(raw)
    for _ in range(8):
        found = raw.rfind(name, floor, found)
        if found < 0:
            return
        at = _skip_back(raw, found)
        if at >= 0 and raw[at] == ord(","):
            at = _skip_back(raw, at)
            if at >= floor and raw[at] == ord("]"):
                yield at


def _skip_back(raw: bytes, at: int) -> int:
    at -= 1
    while at >= 0 and raw[at] in _WS:
        at -= 1
    return at


def read_after(raw: bytes, known: Known, *, max_depth: int) -> Reading | None:
    """`raw` read as `fast_loads` reads it, reading only what follows the longest of
    `known.bounds` it starts with; None when it starts with none or only a whole reading
    can tell. TooDeep as there."""
    if len(raw) > FAST_MAX_BYTES:
        return None
    whole = memoryview(known.raw)
    for offset, count in _candidates(raw, known):
        if len(raw) <= offset or not raw.startswith(whole[:offset]):
            continue
        try:
            rest = orjson.loads(_opening(known.key) + raw[offset:])
        except orjson.JSONDecodeError:
            return None
        items = rest.get(known.key)
        # A second array under the key (a duplicate member) would hold no stand-in first.
        if not isinstance(items, list) or not items or items[0] != _STAND_IN:
            return None
        deep, wide = measure(rest, max_depth)
        if deep:
            raise TooDeep(max_depth)
        if wide:
            return None
        added = items[1:]
        value = dict(known.members)
        value[known.key] = known.items[:count] + added
        for name, member in rest.items():
            if name != known.key:
                value[name] = member
        return Reading(value=value, count=count, offset=offset, added=added, source=known)
    return None


def _candidates(raw: bytes, known: Known) -> list[tuple[int, int]]:
    """Where `raw` may be read from: the known bounds, and with message ends known, the last
    one before the first byte `raw` and the known body differ at (a retry reads from the
    array's end, an edited history from its first edit)."""
    if not known.offsets:
        return list(known.bounds)
    same = _common_prefix(raw, known.raw)
    # The last message end whose bytes up to it both share (the byte at it may differ).
    index = bisect_right(known.offsets, same) - 1
    if index < 0:
        return []
    return [(known.offsets[index], index + 1)]


_BLOCK = 1 << 14


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` share (compared a block at a time, in C)."""
    left, right = memoryview(a), memoryview(b)
    limit = min(len(a), len(b))
    start = 0
    while start + _BLOCK <= limit and left[start : start + _BLOCK] == right[start : start + _BLOCK]:
        start += _BLOCK
    low, high = start, min(start + _BLOCK, limit)
    # The longest n in [low, high] with the first n bytes equal.
    while low < high:
        middle = (low + high + 1) // 2
        if left[start:middle] == right[start:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class KnownBodies:
    """The last bodies read per conversation (its caller, session and thread), so the next
    call reads only what it adds.

    Bounded by the bytes of the bodies kept (what they parse to adds one to three times
    that, shared along a conversation). A conversation is kept while it is active: one idle
    for `idle_seconds` goes first, and a new conversation finds room only in what that frees.
    Recency alone would evict the conversation that calls next whenever more conversations
    are active than fit, and none would be reused; this way those that fit are. `per_key`
    bodies per conversation: an agent's side calls (a title, a small model's routing call)
    share its session, and an older body still serves a call that changed the last messages
    (a client moving its cache breakpoint)."""

    def __init__(
        self,
        *,
        max_bytes: int,
        per_key: int = 2,
        idle_seconds: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes, self.per_key, self.idle_seconds = max_bytes, per_key, idle_seconds
        self._clock = clock
        # key -> (last used, newest first); least recently used first.
        self._entries: OrderedDict[Any, tuple[float, list[Known]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # Bodies read from a known one, and read whole with a known one to try (misses).
        self.hits = self.misses = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def read(self, key: Any, raw: bytes, *, max_depth: int) -> Reading | None:
        """`raw` read from the conversation's known bodies (read_after); None when none of
        them starts it."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries[key] = (self._clock(), found[1])
            self._entries.move_to_end(key)
            candidates = list(found[1])
        for known in candidates:
            reading = read_after(raw, known, max_depth=max_depth)
            if reading is not None:
                self.hits += 1
                return reading
        self.misses += 1
        return None

    def keep(self, key: Any, known: Known) -> None:
        if known.size > self.max_bytes:
            return
        now = self._clock()
        with self._lock:
            _, entries = self._entries.pop(key, (now, []))
            kept = [known, *entries[: self.per_key - 1]]
            self._bytes += known.size - sum(older.size for older in entries[self.per_key - 1 :])
            self._entries[key] = (now, kept)
            # Idle conversations make room first (the least recently used lead).
            while self._bytes > self.max_bytes:
                oldest, (used, dropped) = next(iter(self._entries.items()))
                if oldest == key or now - used < self.idle_seconds:
                    break
                del self._entries[oldest]
                self._bytes -= sum(item.size for item in dropped)
            # Still no room: this conversation's older bodies go, then its own.
            while self._bytes > self.max_bytes and kept:
                self._bytes -= kept.pop().size
            if not kept:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    def __iter__(self) -> Iterator[Known]:
        with self._lock:
            return iter([known for _, entries in self._entries.values() for known in entries])
