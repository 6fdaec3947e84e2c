"""The one bound on provider-reported usage figures, for the events a reply is recorded as and
the calls ledger alike (pure: no Django).

A provider (or a stand-in, or a proxy in between) may report figures no reply holds: 10^13
prompt tokens, 10^19 (past PostgreSQL's bigint: the call's row was lost), cache reads above the
prompt they are part of, reasoning above the output it is part of. Each such figure is dropped
alone and named with the reason in `usageDropped`; what remains is recorded, and the reply with
it. The gateway bounds a reply once, when it is read (compaction_app/gateway/messages.Reply);
the calls ledger applies the same bound to what it is handed (sessions_app/calls.call_record),
so no caller can store past it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    "reasoning_tokens": "reasoningTokens",
}

# Where the parts a provider bills apart (Anthropic's compaction iterations, a reply's
# `priced_apart`) are named when they are dropped: the API name of the usage they came in.
PARTS_NAME = "iterations"


def bound_usage(
    figures: Mapping[str, int | None],
) -> tuple[dict[str, int | None], dict[str, str]]:
    """The figures the ledger can record, and a note per figure dropped (by its API name).

    Each figure is dropped alone when it is not a whole number from 0 to MAX_FIGURE; the cache
    parts (reads and writes) are dropped when together they exceed the prompt they are parts
    of, the one-hour writes when they exceed the writes, the reasoning tokens when they exceed
    the output (completion) they are part of. Figures not named in NAMES pass as they are."""
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
    completion = kept.get("completion_tokens")
    reasoning = kept.get("reasoning_tokens")
    if reasoning and completion is None:
        # A part of an output that is not known (unreported or dropped) cannot be checked.
        drop("reasoning_tokens", "completionTokens, of which it is a part, is not known")
    elif completion is not None and (reasoning or 0) > completion:
        drop("reasoning_tokens", f"exceeds completionTokens ({completion})")
    return kept, dropped


def bound_parts(
    kept: Mapping[str, int | None],
    parts: Sequence[Mapping[str, int | None]],
) -> tuple[tuple[dict[str, int | None], ...], dict[str, str]]:
    """The parts of `kept` (bound_usage's figures) a provider bills apart, when the ledger can
    price them, else none and a note (by PARTS_NAME). The whole's prompt and completion must be
    known, each part's figures must pass bound_usage and, figure by figure, the parts together
    must not exceed the whole they are parts of: priced apart, an impossible part would otherwise
    reach the bill the bounded whole kept out of it."""
    if not parts:
        return (), {}
    for name in ("prompt_tokens", "completion_tokens"):
        if kept.get(name) is None:
            # The parts are priced out of the whole: an unknown whole holds no known parts.
            return (), {PARTS_NAME: f"the whole's {NAMES[name]} is not known"}
    checked: list[dict[str, int | None]] = []
    for part in parts:
        figures, part_dropped = bound_usage(part)
        if part_dropped:
            name, why = next(iter(part_dropped.items()))
            return (), {PARTS_NAME: f"a part's {name}: {why}"[:200]}
        checked.append({name: figures.get(name) for name in NAMES})
    for name, api_name in NAMES.items():
        total = sum(part.get(name) or 0 for part in checked)
        if total > (kept.get(name) or 0):
            return (), {
                PARTS_NAME: f"the parts' {api_name} ({total}) exceed the whole ({kept.get(name)})"
            }
    return tuple(checked), {}
