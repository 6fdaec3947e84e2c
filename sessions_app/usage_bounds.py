"""The one bound on provider-reported usage figures, for the events a reply is recorded as and
the calls ledger alike (pure: no Django).

A provider (or a stand-in, or a proxy in between) may report figures no reply holds: 10^13
prompt tokens, 10^19 (past PostgreSQL's bigint: the call's row was lost), cache reads above the
prompt they are part of. Each such figure is dropped alone and named with the reason in
`usageDropped`; what remains is recorded, and the reply with it. The gateway bounds a reply once,
when it is read (compaction_app/gateway/messages.Reply); the calls ledger applies the same bound
to what it is handed (sessions_app/calls.call_record), so no caller can store past it.
"""

from __future__ import annotations

from collections.abc import Mapping

# One figure's bound (sessions_app.services.MAX_REPORTED_TOKENS, the REST API's too): no real
# reply comes near it; priced at the dearest rates, a call stays within a bigint of nanodollars.
MAX_FIGURE = 10**12

# The neutral figures (the Reply's and the Call's field names) and their API names.
NAMES = {
    "prompt_tokens": "promptTokens",
    "completion_tokens": "completionTokens",
    "total_tokens": "totalTokens",
    "cached_input_tokens": "cachedInputTokens",
    "cache_write_tokens": "cacheWriteTokens",
    "cache_write_1h_tokens": "cacheWrite1hTokens",
}


def bound_usage(
    figures: Mapping[str, int | None],
) -> tuple[dict[str, int | None], dict[str, str]]:
    """The figures the ledger can record, and a note per figure dropped (by its API name).

    Each figure is dropped alone when it is not a whole number from 0 to MAX_FIGURE; the cache
    parts (reads and writes) are dropped when together they exceed the prompt they are parts
    of, the one-hour writes when they exceed the writes. Figures not named in NAMES pass as
    they are."""
    kept = dict(figures)
    dropped: dict[str, str] = {}

    def drop(name: str, why: str) -> None:
        if kept.get(name) is not None:
            kept[name] = None
            dropped[NAMES.get(name, name)] = why

    for name in NAMES:
        value = figures.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            drop(name, f"{str(value)[:40]} is not a whole number of tokens")
        elif not 0 <= value <= MAX_FIGURE:
            drop(name, f"{value} is out of range (0 to {MAX_FIGURE})")
    prompt = kept.get("prompt_tokens")
    parts = (kept.get("cached_input_tokens") or 0) + (kept.get("cache_write_tokens") or 0)
    if prompt is not None and parts > prompt:
        why = f"cache reads and writes ({parts}) exceed promptTokens ({prompt})"
        drop("cached_input_tokens", why)
        drop("cache_write_tokens", why)
        drop("cache_write_1h_tokens", why)
    if (kept.get("cache_write_1h_tokens") or 0) > (kept.get("cache_write_tokens") or 0):
        drop("cache_write_1h_tokens", "exceeds cacheWriteTokens")
    return kept, dropped
