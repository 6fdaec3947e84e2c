"""A conversation request's body, read once and fast (pure).

The gateway reads every call's whole body on the event loop, and the body grows with the
conversation: with `json.loads` plus a Python walk for the nesting bound, reading was most of
what a 1,600-message call added (issue 31, item 5). orjson reads the same JSON in a fraction
of the time, and `nests_deeper` measures the depth level by level in C iterators.

orjson is taken only where its answer is exactly `strict_loads(…, finite=False)`'s, so what
the gateway accepts, refuses, records and forwards is unchanged:

- a body over FAST_MAX_BYTES, where orjson's transient memory would break the gateway's
  bound on what a large body costs, is read the exact way;
- a body orjson refuses (a byte-order mark, a lone surrogate, NaN, a number past a double's
  range, nesting past its own limit of 1,024, invalid UTF-8, UTF-16/32, malformed JSON) goes
  to the exact reader, which gives today's value or today's error;
- orjson reads an integer past 64 bits as a float where Python keeps the int: a body holding
  a run of 19 digits or more (anywhere, strings included: cheap to find, rare) goes to the
  exact reader too. Shorter numbers read alike (checked against `float()` on 300,000 random
  decimals; `test_gateway_body.py` compares both readers on generated bodies).

Duplicate keys keep the last value in both readers.
"""

from __future__ import annotations

from itertools import chain, compress
from typing import Any

import orjson

# Every digit to b"0": a run of LONG_DIGITS zeros is then a run of that many digits.
_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
LONG_DIGITS = 19
_LONG = b"0" * LONG_DIGITS
# orjson's reader holds up to about 12x the body while it reads (a tree of every value,
# sized for the worst case: measured with tracemalloc): past this size the exact reader, which
# holds the text and the value (issue 22, row 14), reads it. A 1,600-message conversation
# is 0.3 MB.
FAST_MAX_BYTES = 1 << 20

_IS_DICT = frozenset({dict}).__contains__
_IS_LIST = frozenset({list}).__contains__
_IS_CONTAINER = frozenset({dict, list}).__contains__


def fast_loads(raw: bytes) -> Any | None:
    """The body as `strict_loads(raw, finite=False)` reads it, or None when only that
    reader can tell (see the module's note): the caller then reads it the exact way."""
    if len(raw) > FAST_MAX_BYTES or _has_long_number(raw):
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _has_long_number(raw: bytes) -> bool:
    return raw.translate(_DIGITS).find(_LONG) >= 0


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether decoded JSON nests arrays/objects more than `limit` levels (as
    sessions_app.api.parsers.check_depth measures it), one level at a time: each level's
    children are gathered and filtered by C iterators, with no Python step per value.
    A walk per value took 1 ms of a 1,600-message body; this takes a quarter of that."""
    level = [value] if _IS_CONTAINER(type(value)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        kinds = list(map(type, level))
        dicts = compress(level, map(_IS_DICT, kinds))
        lists = compress(level, map(_IS_LIST, kinds))
        children = list(
            chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists))
        )
        level = list(compress(children, map(_IS_CONTAINER, map(type, children))))
    return False
