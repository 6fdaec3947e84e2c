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

from itertools import chain, compress
from typing import Any

import orjson

# orjson's reader holds up to about 12x the body while it reads (a tree of every value,
# sized for the worst case: measured with tracemalloc): past this size the exact reader, which
# holds the text and the value (issue 22, row 14), reads it. A 1,600-message conversation
# is 0.3 MB.
FAST_MAX_BYTES = 1 << 20

# orjson reads an integer outside 64 bits as a float; every such float is at least this large.
_WIDE = float(2**63)

_IS_DICT = frozenset({dict}).__contains__
_IS_LIST = frozenset({list}).__contains__
_IS_FLOAT = frozenset({float}).__contains__
_CONTAINERS = frozenset({dict, list})


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
    deep, wide = _walk(value, max_depth)
    if deep:
        raise TooDeep(max_depth)
    # A float this large may have been an integer Python would keep whole.
    return None if wide else value


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether decoded JSON nests arrays/objects more than `limit` levels (as
    sessions_app.api.parsers.check_depth measures it)."""
    return _walk(value, limit)[0]


def _walk(value: Any, limit: int) -> tuple[bool, bool]:
    """(nests deeper than `limit`, holds a float of 2**63 or more), level by level: each
    level's values are typed, filtered and gathered by C iterators, with no Python step per
    value. A walk per value took 1 ms of a 1,600-message body; this takes a quarter of that,
    and finds orjson's wide floats on the way (a scan of the bytes for long digit runs cost
    half as much again). A level of leaves only (a conversation's texts) ends the walk once
    its kinds are known, and a level of objects only skips the filtering."""
    level = [value]
    depth = 0
    wide = False
    while True:
        kinds = list(map(type, level))
        present = set(kinds)
        if float in present and not wide:
            wide = any(abs(number) >= _WIDE for number in compress(level, map(_IS_FLOAT, kinds)))
        if present.isdisjoint(_CONTAINERS):
            return False, wide
        depth += 1
        if depth > limit:
            return True, wide
        if len(present) == 1 and dict in present:
            # Objects only: their values' kinds first; a level of leaves is never built.
            if set(map(type, chain.from_iterable(map(dict.values, level)))).isdisjoint(
                _CONTAINERS | {float}
            ):
                return False, wide
            level = list(chain.from_iterable(map(dict.values, level)))
            continue
        dicts = compress(level, map(_IS_DICT, kinds))
        lists = compress(level, map(_IS_LIST, kinds))
        level = list(
            chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists))
        )
