from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rest_framework import serializers

from compaction_app import economics
from compaction_app.models import CompactionRun, RunningSummary
from compaction_app.run_documents import outcome
from sessions_app.api.serializers import StrictBooleanField, StrictCharField
from sessions_app.event_documents import iso_datetime

if TYPE_CHECKING:
    from compaction_app.services import DryRun


class CompactionRequestSerializer(serializers.Serializer):
    strategy = StrictCharField(required=False, allow_blank=False)
    summarizer = StrictCharField(required=False, allow_blank=False)
    dryRun = StrictBooleanField(required=False)
    targetRatio = serializers.FloatField(required=False, min_value=0.01, max_value=1.0)
    # A thread's key (GET /sessions/{id}/threads); default: the main thread, if any.
    thread = StrictCharField(
        required=False,
        allow_blank=False,
        max_length=200,
        help_text="One of the session's threads (GET /sessions/{id}/threads); default: the main "
        "thread, if any. A key naming no thread of the session → 400 unknown_thread.",
    )


class DroppedEvidenceSerializer(serializers.Serializer):
    kind = serializers.CharField()
    text = serializers.CharField()
    seq = serializers.IntegerField()


class LossReportSerializer(serializers.Serializer):
    evidenceBefore = serializers.IntegerField()
    evidenceKept = serializers.IntegerField()
    keptPercent = serializers.FloatField()
    dropped = DroppedEvidenceSerializer(many=True)
    droppedTotal = serializers.IntegerField()
    # Absent from reports stored before it existed.
    droppedReachable = serializers.IntegerField(
        required=False,
        help_text="Dropped items whose event the context cites ([#42] in a summary line or a "
        "cleared output's placeholder): not present, but one ledger_recall away.",
    )


class CompactionSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    sessionId = serializers.UUIDField()
    strategy = serializers.CharField()
    summarizer = serializers.CharField()
    trigger = serializers.CharField()
    # The thread the run compacted (its key); null: the whole ledger.
    thread = serializers.CharField(allow_null=True)
    status = serializers.CharField()
    tokensBefore = serializers.IntegerField(allow_null=True)
    tokensAfter = serializers.IntegerField(allow_null=True)
    eventsBefore = serializers.IntegerField(allow_null=True)
    eventsAfter = serializers.IntegerField(allow_null=True)
    reductionPercent = serializers.FloatField(allow_null=True)
    summaryTokens = serializers.IntegerField(allow_null=True)
    outcome = serializers.ChoiceField(
        choices=["compacted", "nothing_to_fold", "failed"],
        allow_null=True,
        help_text="compacted (events folded or tool results cleared), nothing_to_fold "
        "(completed, context unchanged: see reason), failed; null while pending or running.",
    )
    reason = serializers.CharField(
        allow_null=True, help_text="Why nothing was folded (or why the run failed)."
    )
    foldedCount = serializers.IntegerField(
        help_text="Events folded, or for clear_tool_results the tool results cleared."
    )
    error = serializers.CharField(allow_null=True)
    createdAt = serializers.DateTimeField()
    startedAt = serializers.DateTimeField(allow_null=True)
    finishedAt = serializers.DateTimeField(allow_null=True)
    revertedAt = serializers.DateTimeField(allow_null=True)
    reverted = serializers.BooleanField()
    lossReport = LossReportSerializer(allow_null=True)
    economics = serializers.JSONField(
        allow_null=True,
        help_text="What the compaction sheds from every later call, the cache write it "
        "causes, the calls to pay that back, and measured on the gateway calls after it the "
        "net dollars saved (docs/costs.md); null for a run that changed nothing.",
    )


def dry_run_to_dict(dry: DryRun) -> dict[str, Any]:
    """What a dry run would do (POST /compactions with dryRun; the MCP tool answers with the
    lengths of the two id lists)."""
    plan = dry.plan
    return {
        "dryRun": True,
        "strategy": dry.strategy,
        "eventsToFold": list(plan.fold_ids),
        "toolResultsToClear": [c.event_id for c in plan.cleared],
        "tokensBefore": plan.tokens_before,
        "tokensAfter": plan.tokens_after,
        "eventsBefore": plan.events_before,
        "eventsAfter": plan.events_after,
        "needsSummary": plan.needs_summary,
        "notes": list(plan.notes),
    }


def run_to_dict(run: CompactionRun) -> dict[str, Any]:
    def iso(value: Any) -> str | None:
        return iso_datetime(value) if value else None

    return {
        "id": str(run.pk),
        "sessionId": str(run.session_id),
        "strategy": run.strategy,
        "summarizer": run.summarizer,
        "trigger": run.trigger,
        "thread": run.thread or None,
        "status": run.status,
        "tokensBefore": run.tokens_before,
        "tokensAfter": run.tokens_after,
        "eventsBefore": run.events_before,
        "eventsAfter": run.events_after,
        "reductionPercent": run.reduction_percent,
        "summaryTokens": run.summary_tokens,
        "outcome": outcome(run)[0],
        "reason": outcome(run)[1],
        "foldedCount": run.folded_count,
        "error": run.error or None,
        "createdAt": iso(run.created_at),
        "startedAt": iso(run.started_at),
        "finishedAt": iso(run.finished_at),
        "revertedAt": iso(run.reverted_at),
        "reverted": run.reverted_at is not None,
        "lossReport": run.loss_report,
        "economics": economics.document(run),
    }


class PlanSerializer(serializers.Serializer):
    dryRun = serializers.BooleanField()
    strategy = serializers.CharField()
    eventsToFold = serializers.ListField(child=serializers.UUIDField())
    toolResultsToClear = serializers.ListField(child=serializers.UUIDField())
    tokensBefore = serializers.IntegerField()
    tokensAfter = serializers.IntegerField()
    eventsBefore = serializers.IntegerField()
    eventsAfter = serializers.IntegerField()
    needsSummary = serializers.BooleanField()
    notes = serializers.ListField(child=serializers.CharField())


class RunningSummarySerializer(serializers.Serializer):
    summary = serializers.CharField()
    summarizedMessageIds = serializers.ListField(child=serializers.UUIDField())
    lastSummarizedMessageId = serializers.UUIDField(allow_null=True)
    tokenCount = serializers.IntegerField(
        help_text="The summary text's own tokens (what maxSummaryTokens bounds)."
    )
    messageTokenCount = serializers.IntegerField(
        allow_null=True,
        help_text="What the summary costs in the context: its COMPACTION event's tokenCount "
        "(the text plus the message framing), as the dashboard shows it.",
    )
    updatedAt = serializers.DateTimeField()


def summary_to_dict(summary: RunningSummary, *, message_tokens: int | None) -> dict[str, Any]:
    return {
        **summary.snapshot(),
        "messageTokenCount": message_tokens,
        "updatedAt": iso_datetime(summary.updated_at),
    }
