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
) -> dict[str, int | None]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "cached_input_tokens": cached,
        "cache_write_tokens": write,
        "cache_write_1h_tokens": write_1h,
        "reasoning_tokens": reasoning,
    }


# The ledger's bound on one reported figure (sessions_app.services.MAX_REPORTED_TOKENS):
# no real reply comes near it; one past it is a provider's (or a stand-in's) mistake.
MAX_FIGURE = 10**12

_NAMES = {
    "prompt_tokens": "promptTokens",
    "completion_tokens": "completionTokens",
    "total_tokens": "totalTokens",
    "cached_input_tokens": "cachedInputTokens",
    "cache_write_tokens": "cacheWriteTokens",
    "cache_write_1h_tokens": "cacheWrite1hTokens",
    "reasoning_tokens": "reasoningTokens",
}


def of_reply(reply: Any) -> dict[str, int | None]:
    """The neutral figures a Reply carries."""
    return {name: getattr(reply, name) for name in _NAMES}


def bounded(figures: dict[str, int | None]) -> tuple[dict[str, int | None], dict[str, str]]:
    """The figures the ledger can record, and a note per figure dropped (by its API name).

    Each figure is dropped alone when it is past MAX_FIGURE; the cache parts (reads and
    writes) are dropped when together they exceed the prompt they are parts of, the
    one-hour writes when they exceed the writes. What remains is recorded, and the reply
    with it: the provider's own usage object stays in the event's metadata as it came."""
    kept = dict(figures)
    dropped: dict[str, str] = {}

    def drop(name: str, why: str) -> None:
        if kept.get(name) is not None:
            kept[name] = None
            dropped[_NAMES[name]] = why

    for name, value in figures.items():
        if value is not None and not 0 <= value <= MAX_FIGURE:
            drop(name, f"{value} is out of range (0 to {MAX_FIGURE})")
    prompt = kept["prompt_tokens"]
    parts = (kept["cached_input_tokens"] or 0) + (kept["cache_write_tokens"] or 0)
    if prompt is not None and parts > prompt:
        why = f"cache reads and writes ({parts}) exceed promptTokens ({prompt})"
        drop("cached_input_tokens", why)
        drop("cache_write_tokens", why)
        drop("cache_write_1h_tokens", why)
    if (kept["cache_write_1h_tokens"] or 0) > (kept["cache_write_tokens"] or 0):
        drop("cache_write_1h_tokens", "exceeds cacheWriteTokens")
    if (kept.get("reasoning_tokens") or 0) > (kept["completion_tokens"] or 0):
        drop("reasoning_tokens", "exceeds completionTokens")
    return kept, dropped


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
