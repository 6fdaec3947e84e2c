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
