"""The API's JSON parser: DRF's, with a bound on nesting depth; and the strict JSON loader
the gateway shares with it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rest_framework.parsers import JSONParser

from sessions_app.errors import InvalidInput

# Deep enough for any real message structure; shallow enough that nothing downstream
# (validation, token counting, json.dumps, the renderer) can hit Python's recursion limit.
MAX_JSON_DEPTH = 64


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests arrays/objects more than `limit` levels; iterative, so any depth
    the decoder accepted is measured without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, Mapping) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def nesting_error() -> InvalidInput:
    return InvalidInput(
        f"JSON nests deeper than {MAX_JSON_DEPTH} levels",
        code="nesting_too_deep",
        limit=MAX_JSON_DEPTH,
    )


def check_depth(value: Any) -> None:
    """Refuse a decoded JSON value nested deeper than MAX_JSON_DEPTH."""
    if isinstance(value, dict | list) and _too_deep(value, MAX_JSON_DEPTH):
        raise nesting_error()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def strict_loads(raw: bytes | str) -> Any:
    """`json.loads` without Python's extensions: NaN, Infinity and -Infinity are refused
    (ValueError) instead of becoming floats that no provider and no JSON client accepts.
    The REST parser below is held to the same rule by DRF's STRICT_JSON (on by default)."""
    return json.loads(raw, parse_constant=_refuse_constant)


class LedgerJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            # The C decoder gives up on very deep input before returning anything.
            raise nesting_error() from None
        check_depth(data)
        return data
