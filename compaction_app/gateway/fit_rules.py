"""The fit decision, pure: which messages go to the model (no Django, no ORM)."""

from __future__ import annotations

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
