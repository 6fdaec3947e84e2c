"""What a run tells the outside when it ends: its outcome and the words for it (the
`COMPACTION_COMPLETE` message is built from them in compaction_app.realtime.messages), and the
snapshot the session keeps of its latest run. Shared by the services and the sweeper, which
fails stale runs with the same words."""

from __future__ import annotations

from typing import Any

from compaction_app.models import CompactionRun, RunStatus
from compaction_app.policy import Policy
from sessions_app.models import Session
from sessions_app.session_settings import SessionSettings

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
    target = None
    if run.strategy == "trim" and run.tokens_before is not None:
        target = trim_target(run.session, target_ratio=run.target_ratio)
    return NOTHING_TO_FOLD, nothing_to_fold_reason(
        strategy=run.strategy, tokens=run.tokens_before, target=target
    )


def trim_target(session: Session, *, target_ratio: float | None = None) -> int:
    """The tokens a trim run reaches (the compaction policy's target for it)."""
    policy = Policy.of(SessionSettings.of(session.settings))
    return policy.budget(
        context_limit=session.context_limit, target_ratio=target_ratio
    ).target_tokens


def nothing_to_fold_reason(
    *, strategy: str, tokens: int | None = None, target: int | None = None
) -> str:
    """Why a strategy folds nothing now (a run's `reason`, the dashboard's dry run)."""
    if strategy == "clear_tool_results":
        return "no tool result is old enough to clear; the context is unchanged"
    if strategy == "trim" and tokens is not None and target is not None and tokens <= target:
        return (
            f"the context ({tokens:,} tokens) is already within trim's target ({target:,} "
            "tokens, the compact threshold of the limit); the context is unchanged"
        )
    return (
        "no event may be folded now (the system prompt, the last user message, pinned "
        "events and the newest events are kept); the context is unchanged"
    )


def completion_text(run: CompactionRun) -> str:
    """The human line for a completed run, tokens first (what a run is for), e.g.
    "Compaction complete! 11,319 → 3,495 tokens (69% reduction), 21 events folded"."""
    before, after = run.tokens_before or 0, run.tokens_after or 0
    change = round(100 * (before - after) / before) if before else 0
    effect = f"{change}% reduction" if change >= 0 else f"{-change}% increase"
    count = run.folded_count
    if not count:
        # Not a success to celebrate: what happened and why, in the words the run's JSON uses.
        reason = outcome(run)[1] or ""
        return f"Nothing to fold: {before:,} tokens unchanged — {reason.split(';')[0]}."
    # clear_tool_results folds nothing: what it counts are the results it cleared.
    if run.strategy == "clear_tool_results":
        what = "tool result cleared" if count == 1 else "tool results cleared"
    else:
        what = "event folded" if count == 1 else "events folded"
    return f"Compaction complete! {before:,} → {after:,} tokens ({effect}), {count:,} {what}"


def tokens_text(run: CompactionRun) -> str:
    """A run's tokens before → after as every page writes them: "1,616 → 992 (−38.6 %)", or
    "1,616 (nothing to fold)"; "—" before it has figures."""
    if run.tokens_before is None:
        return "—"
    if run.tokens_after is None:
        return f"{run.tokens_before:,} → —"
    if (
        run.status == RunStatus.COMPLETED
        and not run.folded_count
        and run.tokens_before == run.tokens_after
    ):
        return f"{run.tokens_before:,} (nothing to fold)"
    text = f"{run.tokens_before:,} → {run.tokens_after:,}"
    reduction = run.reduction_percent
    if reduction is not None:
        text += f" (−{reduction} %)" if reduction >= 0 else f" (+{-reduction} %)"
    return text


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
