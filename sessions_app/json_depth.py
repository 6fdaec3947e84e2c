"""How deep decoded JSON nests, measured level by level (pure).

The one measure of the nesting bound (MAX_JSON_DEPTH, sessions_app.api.parsers) for the REST
API's parser and the gateway's body reader (compaction_app/gateway/body.py), which also asks
it for orjson's wide floats on the same walk."""

from __future__ import annotations

from itertools import chain, compress
from typing import Any

# orjson reads an integer outside 64 bits as a float; every such float is at least this large.
WIDE = float(2**63)

_IS_DICT = frozenset({dict}).__contains__
_IS_LIST = frozenset({list}).__contains__
_IS_FLOAT = frozenset({float}).__contains__
_CONTAINERS = frozenset({dict, list})


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether decoded JSON nests arrays/objects more than `limit` levels (a scalar is 0
    levels, `[]` and `{}` are 1); iterative, so any depth the decoder accepted is measured
    without recursion."""
    return measure(value, limit)[0]


def measure(value: Any, limit: int) -> tuple[bool, bool]:
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
            wide = any(abs(number) >= WIDE for number in compress(level, map(_IS_FLOAT, kinds)))
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
