"""The API's JSON parser: strict JSON with a bound on nesting depth, read from the request's
stream so that a large body is held once; and the strict JSON loader the gateway shares
with it."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from rest_framework import parsers as drf_parsers
from rest_framework import renderers
from rest_framework.exceptions import ParseError

from sessions_app.errors import InvalidInput
from sessions_app.json_depth import nests_deeper
from sessions_app.storable import float_keeping_overflow

# Deep enough for any real message structure; shallow enough that nothing downstream
# (validation, token counting, json.dumps, the renderer) can hit Python's recursion limit.
MAX_JSON_DEPTH = 64


def nesting_error() -> InvalidInput:
    return InvalidInput(
        f"JSON nests deeper than {MAX_JSON_DEPTH} levels",
        code="nesting_too_deep",
        limit=MAX_JSON_DEPTH,
    )


def check_depth(value: Any) -> None:
    """Refuse a decoded JSON value nested deeper than MAX_JSON_DEPTH."""
    if nests_deeper(value, MAX_JSON_DEPTH):
        raise nesting_error()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class NumberOutOfRange(ValueError):
    """A JSON number too large for a float (`1e400`): valid JSON that Python reads as infinity."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NumberOutOfRange(f"the number {text[:40]} is out of range")
    return value


def strict_loads(raw: bytes | str, *, finite: bool = True) -> Any:
    """`json.loads` without Python's extensions: NaN, Infinity and -Infinity are refused
    (ValueError) instead of becoming floats that no provider and no JSON client accepts.

    A number too large for a float (`1e400`, valid JSON) would become infinity, which no JSON
    renderer writes back: with `finite` (the REST API) it is refused (NumberOutOfRange);
    without (the gateway, a proxy first) it is read as an OutOfRangeNumber, forwarded as
    sent and recorded as its text (sessions_app.services.storable)."""
    return json.loads(
        raw,
        parse_constant=_refuse_constant,
        parse_float=_finite_float if finite else float_keeping_overflow,
    )


def out_of_range_error(exc: NumberOutOfRange) -> InvalidInput:
    return InvalidInput(
        f"{exc}: JSON numbers must be finite double-precision values",
        code="number_out_of_range",
    )


class LedgerJSONParser(drf_parsers.BaseParser):
    """JSON bodies, as DRF's JSONParser reads them (the request's charset, STRICT_JSON's
    refusal of NaN and Infinity, `ParseError` for anything malformed), plus the nesting bound.

    Not a JSONParser subclass on purpose: for those DRF parses `BytesIO(request.body)`, and
    `request.body` keeps the raw bytes for the rest of the request. This parser reads the
    stream itself and lets go of each form as soon as the next exists (bytes, then text,
    then the parsed value), so a large body is held at most twice at any moment while it is
    parsed, and once after (issue 22, row 14)."""

    media_type = "application/json"
    renderer_class = renderers.JSONRenderer

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        # The request's charset, text encodings only (DRF 3.18, newer than its stubs).
        encoding = drf_parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]
        try:
            text = _read_text(stream, encoding)
            data = strict_loads(text)
        except RecursionError:
            # The C decoder gives up on very deep input before returning anything.
            raise nesting_error() from None
        except NumberOutOfRange as exc:
            raise out_of_range_error(exc) from None
        except ValueError as exc:  # UnicodeDecodeError included
            raise ParseError(f"JSON parse error - {exc}") from None
        del text
        check_depth(data)
        return data


def _read_text(stream: Any, encoding: str) -> str:
    """The whole body as text; its bytes are dropped on return."""
    raw: bytes = stream.read()
    release_freed_memory(len(raw))
    return raw.decode(encoding)


# Bodies from this size on are followed by release_freed_memory's trim.
RELEASE_AFTER_BYTES = 1 << 20


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def release_freed_memory(size: int) -> None:
    """Once a body of `size` bytes has arrived, give the memory freed while it was handed
    over back to the system (glibc's malloc_trim; elsewhere nothing).

    daphne passes a body to the application in 8 KiB messages, all queued at once: as much
    memory again as the body, freed once Django has spooled it, but kept by the allocator in
    small pieces the request's own large allocations do not reuse. A server's resident memory
    went up by 4x an 8 MB append where what the request itself holds is 3x (issue 22, row 14).
    Cheap next to a request that size (a few ms); skipped for smaller ones."""
    if size >= RELEASE_AFTER_BYTES:
        trim = _malloc_trim()
        if trim is not None:
            trim(0)
