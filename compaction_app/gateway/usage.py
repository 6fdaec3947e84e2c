"""Provider usage, read per wire format into the reply's neutral figures. Pure: each wire
module hands its `usage` object to one function here and spreads the result into `Reply`.

The neutral figures: `prompt_tokens` is everything the model read, cached or not;
`cached_input_tokens` (cache reads) and `cache_write_tokens` (cache writes, of which
`cache_write_1h_tokens` at the one-hour rate) are parts of it.
"""

from __future__ import annotations

from typing import Any


def _number(mapping: Any, key: str) -> int | None:
    if not isinstance(mapping, dict):
        return None
    value = mapping.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _fields(
    *,
    prompt: int | None,
    completion: int | None,
    total: int | None,
    cached: int | None = None,
    write: int | None = None,
    write_1h: int | None = None,
) -> dict[str, int | None]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "cached_input_tokens": cached,
        "cache_write_tokens": write,
        "cache_write_1h_tokens": write_1h,
    }


def openai_chat(usage: Any) -> dict[str, int | None]:
    """Chat Completions: `prompt_tokens` includes `prompt_tokens_details.cached_tokens`
    (OpenAI caches prefixes itself and bills no writes). Streamed, this is the final chunk's
    usage, present when the client asked for `stream_options.include_usage`."""
    return _fields(
        prompt=_number(usage, "prompt_tokens"),
        completion=_number(usage, "completion_tokens"),
        total=_number(usage, "total_tokens"),
        cached=_number((usage or {}).get("prompt_tokens_details"), "cached_tokens")
        if isinstance(usage, dict)
        else None,
    )


def openai_responses(usage: Any) -> dict[str, int | None]:
    """Responses: `input_tokens` includes `input_tokens_details.cached_tokens`."""
    return _fields(
        prompt=_number(usage, "input_tokens"),
        completion=_number(usage, "output_tokens"),
        total=_number(usage, "total_tokens"),
        cached=_number((usage or {}).get("input_tokens_details"), "cached_tokens")
        if isinstance(usage, dict)
        else None,
    )


def anthropic_messages(usage: Any) -> dict[str, int | None]:
    """Messages: `input_tokens` counts only what came after the last cache breakpoint, so
    the prompt is input + cache writes + cache reads. The write's 5-minute / 1-hour split is
    in `cache_creation` when the API gives it."""
    if not isinstance(usage, dict) or not usage:
        return _fields(prompt=None, completion=None, total=None)
    read = _number(usage, "cache_read_input_tokens")
    write = _number(usage, "cache_creation_input_tokens")
    creation = usage.get("cache_creation")
    write_1h = _number(creation, "ephemeral_1h_input_tokens")
    if write is None and isinstance(creation, dict):
        parts = [_number(creation, key) for key in creation]
        write = sum(part for part in parts if part is not None) or None
    prompt = (_number(usage, "input_tokens") or 0) + (write or 0) + (read or 0)
    completion = _number(usage, "output_tokens") or 0
    return _fields(
        prompt=prompt,
        completion=completion,
        total=prompt + completion,
        cached=read,
        write=write,
        write_1h=min(write_1h, write) if write_1h is not None and write is not None else None,
    )


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
    return kept, dropped
