"""What the ledger cannot hold, made into something it can (pure).

The REST API refuses text with a NUL or a lone surrogate and numbers that are not finite (the
client can send again). The gateway is a proxy first: what it records came from a client or a
provider that will not resend it, so it records it in a form every read renders instead:

- NUL (U+0000) and lone surrogates (U+D800-U+DFFF) become U+FFFD, the replacement character;
  PostgreSQL's text and jsonb refuse the one, UTF-8 cannot encode the other.
- a number that is not finite (`1e400` overflows a double) becomes the text it was sent as
  (`"1e400"`), or `"Infinity"`, `"-Infinity"`, `"NaN"` when that text is not known; no JSON
  renderer writes infinity back.

`storable` returns the value unchanged (the same object) when there is nothing to replace, so
the common case copies nothing, and says what it replaced so the caller can note it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

REPLACEMENT = "\ufffd"
# A str holding one of these cannot be encoded to UTF-8 (a lone surrogate from a JSON escape).
SURROGATE = re.compile("[\ud800-\udfff]")

# What `storable` reports it replaced.
NUL = "nul"
LONE_SURROGATE = "lone_surrogate"
NON_FINITE_NUMBER = "non_finite_number"


class OutOfRangeNumber(float):
    """A JSON number that overflows a float (`1e400`), kept as the infinity Python reads it as
    plus the text it was sent as, so that what is recorded of it can say what was sent."""

    text: str

    def __new__(cls, text: str) -> OutOfRangeNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


def float_keeping_overflow(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else OutOfRangeNumber(text)


def provider_loads(raw: bytes | str) -> Any:
    """A provider's answer (a body, an SSE frame) as Python's `json.loads` reads it, except
    that a number past a double's range keeps the text it came as (OutOfRangeNumber), for
    the record to show."""
    return json.loads(raw, parse_float=float_keeping_overflow)


def storable_text(value: str, replaced: set[str] | None = None) -> str:
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT)
        if replaced is not None:
            replaced.add(NUL)
    # Searched for, not encoded: encoding a 30 MB content to find out made a copy of it.
    if not value.isascii() and SURROGATE.search(value):
        value = SURROGATE.sub(REPLACEMENT, value)
        if replaced is not None:
            replaced.add(LONE_SURROGATE)
    return value


def _number_text(value: float) -> str:
    text = getattr(value, "text", None)
    if isinstance(text, str):
        return text
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def storable(value: Any, replaced: set[str] | None = None) -> Any:
    """`value` (decoded JSON) with NULs, lone surrogates and non-finite numbers replaced as
    the module says; `replaced` collects which of them were found."""
    found: set[str] = set() if replaced is None else replaced
    return _walk(value, found)


def _walk(value: Any, found: set[str]) -> Any:
    if isinstance(value, str):
        return storable_text(value, found)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        found.add(NON_FINITE_NUMBER)
        return _number_text(value)
    if isinstance(value, dict):
        items = [(_walk(key, found), _walk(item, found)) for key, item in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        walked = [_walk(item, found) for item in value]
        if all(a is b for a, b in zip(walked, value, strict=True)):
            return value
        return walked
    return value


def _stored_float(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else text


def load_stored(text: str) -> Any:
    """Stored JSON text (an event's structured content, a tool call's arguments) decoded so
    that whatever it holds renders: a number that is not finite (stored before the door
    refused it, or a tool call's arguments that are text to the ledger) is read as its text,
    never as a float no JSON renderer writes."""
    return json.loads(text, parse_float=_stored_float, parse_constant=str)
