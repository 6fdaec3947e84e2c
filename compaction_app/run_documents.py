"""What a run tells the outside when it ends: the `COMPACTION_COMPLETE` message (websocket and
dashboard) and the snapshot the session keeps of its latest run. Shared by the services and
the sweeper, which fails stale runs with the same words."""

from __future__ import annotations

from typing import Any

from compaction_app import economics
from compaction_app.models import CompactionRun, RunStatus


def complete_message(run: CompactionRun) -> dict[str, Any]:
    success = run.status == RunStatus.COMPLETED
    text = completion_text(run) if success else f"Compaction failed: {run.error}"
    return {
        "type": "COMPACTION_COMPLETE",
        "sessionId": str(run.session_id),
        "compactionId": str(run.pk),
        "success": success,
        "tokensBefore": run.tokens_before,
        "tokensAfter": run.tokens_after,
        "eventsBefore": run.events_before,
        "eventsAfter": run.events_after,
        "reductionPercent": run.reduction_percent,
        "error": run.error or None,
        "keptPercent": (run.loss_report or {}).get("keptPercent") if success else None,
        "outcome": outcome(run)[0],
        # Predicted now; measured on the calls that follow (the run's API document).
        "economics": economics.document(run, closed=False) if success else None,
        "message": text,
    }


NOTHING_TO_FOLD = "nothing_to_fold"


def outcome(run: CompactionRun) -> tuple[str | None, str | None]:
    """(outcome, reason) of a run, as its JSON says it: "compacted" (events folded or tool
    results cleared), "nothing_to_fold" (completed without changing the context; the reason
    says why), "failed", or None while it is pending or running."""
    if run.status == RunStatus.FAILED:
        return "failed", run.error or None
    if run.status != RunStatus.COMPLETED:
        return None, None
    if run.folded_count:
        return "compacted", None
    if run.strategy == "clear_tool_results":
        reason = "no tool result is old enough to clear; the context is unchanged"
    else:
        reason = (
            "no event may be folded now (the system prompt, the last user message, pinned "
            "events and the newest events are kept); the context is unchanged"
        )
    return NOTHING_TO_FOLD, reason


def completion_text(run: CompactionRun) -> str:
    """The human line for a completed run, tokens first (what a run is for), e.g.
    "Compaction complete! 11,319 → 3,495 tokens (69% reduction), 21 events folded"."""
    before, after = run.tokens_before or 0, run.tokens_after or 0
    change = round(100 * (before - after) / before) if before else 0
    effect = f"{change}% reduction" if change >= 0 else f"{-change}% increase"
    count = run.folded_count
    if not count:
        return f"Compaction complete! Nothing to fold: {before:,} tokens unchanged"
    # clear_tool_results folds nothing: what it counts are the results it cleared.
    if run.strategy == "clear_tool_results":
        what = "tool result cleared" if count == 1 else "tool results cleared"
    else:
        what = "event folded" if count == 1 else "events folded"
    return f"Compaction complete! {before:,} → {after:,} tokens ({effect}), {count:,} {what}"


def run_snapshot(run: CompactionRun) -> dict[str, Any]:
    return {
        "id": str(run.pk),
        "strategy": run.strategy,
        "trigger": run.trigger,
        "status": run.status,
        "tokensBefore": run.tokens_before,
        "tokensAfter": run.tokens_after,
        "reductionPercent": run.reduction_percent,
        "finishedAt": run.finished_at.isoformat() if run.finished_at else None,
    }
