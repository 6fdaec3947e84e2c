"""The reply's neutral usage figures, and their bounds. Pure: each provider package reads its
own usage object (its `usage`) into these figures with `number` and `fields`, and spreads
the result into `Reply`.

The neutral figures: `prompt_tokens` is everything the model read, cached or not;
`cached_input_tokens` (cache reads) and `cache_write_tokens` (cache writes, of which
`cache_write_1h_tokens` at the one-hour rate) are parts of it. `reasoning_tokens` is the
part of `completion_tokens` the model spent reasoning (every provider bills it as output).
"""

from __future__ import annotations

from typing import Any

from sessions_app import usage_bounds


def number(mapping: Any, key: str) -> int | None:
    if not isinstance(mapping, dict):
        return None
    value = mapping.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def fields(
    *,
    prompt: int | None,
    completion: int | None,
    total: int | None,
    cached: int | None = None,
    write: int | None = None,
    write_1h: int | None = None,
    reasoning: int | None = None,
    dropped: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Reply's usage fields; `dropped`: figures the provider reported that could not be
    read (`unreadable`), noted in the Reply's `usage_dropped`."""
    return {
        "usage_dropped": dict(dropped or {}),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "cached_input_tokens": cached,
        "cache_write_tokens": write,
        "cache_write_1h_tokens": write_1h,
        "reasoning_tokens": reasoning,
    }


# The one bound (sessions_app/usage_bounds.py), applied when a Reply is made (messages.py).
MAX_FIGURE = usage_bounds.MAX_FIGURE
_NAMES = usage_bounds.NAMES


def of_reply(reply: Any) -> dict[str, int | None]:
    """The neutral figures a Reply carries."""
    return {name: getattr(reply, name) for name in _NAMES}


def bounded(figures: dict[str, int | None]) -> tuple[dict[str, int | None], dict[str, str]]:
    """The figures the ledger can record, and a note per figure dropped (by its API name):
    usage_bounds.bound_usage."""
    return usage_bounds.bound_usage(figures)


def unreadable(mapping: Any, names: dict[str, str]) -> dict[str, str]:
    """{API name: why} for each key of `names` (the provider's key: the figure's API name)
    that `mapping` holds with a value that is not a whole number of tokens (a negative number,
    a fraction, a number past a double such as `1e400`, a string, a boolean): read as absent,
    never as 0, and named."""
    if not isinstance(mapping, dict):
        return {}
    return {
        name: f"{key} {_shown(mapping[key])} is not a whole number of tokens"
        for key, name in names.items()
        if mapping.get(key) is not None and number(mapping, key) is None
    }


def _shown(value: Any) -> str:
    text = getattr(value, "text", None)  # a number past a double, kept as its text
    return (text if isinstance(text, str) else repr(value))[:40]


def call_usages(parts: tuple[dict[str, int | None], ...]) -> tuple[Any, ...]:
    """Neutral figures (a reply's `priced_apart`) as pricing's CallUsage."""
    from sessions_app.pricing import CallUsage

    return tuple(
        CallUsage(
            input_tokens=part.get("prompt_tokens") or 0,
            output_tokens=part.get("completion_tokens") or 0,
            cached_input_tokens=part.get("cached_input_tokens") or 0,
            cache_write_tokens=part.get("cache_write_tokens") or 0,
            cache_write_1h_tokens=part.get("cache_write_1h_tokens") or 0,
        )
        for part in parts
    )
