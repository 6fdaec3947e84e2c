"""The fit decision, pure: which messages go to the model (no Django, no ORM)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from sessions_app import context_window

PASS_THROUGH = "pass_through"
LEDGER = "ledger"


def decide(
    *, tokens: int, limit: int, compact_threshold: float, hard_threshold: float, compacted: bool
) -> str:
    """PASS_THROUGH: the client's own messages go out as they are (the ledger holds exactly
    them and they fit under the compact threshold). LEDGER: the messages come from the
    ledger's ladder (a compacted session's active context, pruned or compacted as needed)."""
    level = context_window.window_level(
        tokens=tokens,
        limit=limit,
        compact_threshold=compact_threshold,
        hard_threshold=hard_threshold,
    )
    if level == "ok" and not compacted:
        return PASS_THROUGH
    return LEDGER


def prune_turns(
    *,
    kept: Sequence[int],
    costs: Mapping[int, int],
    fixed: AbstractSet[int],
    starts: AbstractSet[int],
    extra: int,
    budget: int,
) -> list[int] | None:
    """The last resort: drop the oldest whole turns of `kept` (a turn runs from one user
    message that is not a tool result to the next) until what stays costs at most `budget`
    (`extra`: what goes out besides, the summary). The `fixed` messages (system) and the last
    turn always stay; None when even they do not fit."""
    body = [i for i in kept if i not in fixed]
    head = [i for i in kept if i in fixed]
    cuts = [i for i in body if i in starts]
    if not body:
        return list(kept)
    for cut in [body[0], *[c for c in cuts if c > body[0]]]:
        remaining = head + [i for i in body if i >= cut]
        if context_window.context_cost([costs[i] for i in remaining]) + extra <= budget:
            return remaining
    return None
