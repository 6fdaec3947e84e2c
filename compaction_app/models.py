from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from sessions_app.models import Event, Session


class Trigger(models.TextChoices):
    MANUAL = "manual"
    AUTO = "auto"
    REFRESH = "refresh"
    HARD_LIMIT = "hard_limit"
    GATEWAY = "gateway"


class RunStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


ACTIVE_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING)


class CompactionRun(models.Model):
    """One compaction of one session. At most one is pending or running per session: the
    partial unique constraint makes the database refuse a second one."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="compaction_runs")
    strategy = models.CharField(max_length=40)
    summarizer = models.CharField(max_length=40, blank=True, default="")
    trigger = models.CharField(max_length=20, choices=Trigger.choices)
    target_ratio = models.FloatField(null=True, blank=True)
    # The thread of the session the run compacts (its key); "" for the whole ledger.
    thread = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tokens_before = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_after = models.PositiveBigIntegerField(null=True, blank=True)
    events_before = models.PositiveIntegerField(null=True, blank=True)
    events_after = models.PositiveIntegerField(null=True, blank=True)
    summary_tokens = models.PositiveIntegerField(null=True, blank=True)
    folded_count = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    # Last sign of life: set when the run is queued, when a worker starts it and periodically
    # while it works. The sweeper (compaction_app/sweeper.py) fails a running run whose
    # heartbeat stopped and re-queues a pending one whose task never arrived.
    heartbeat_at = models.DateTimeField(default=timezone.now)
    requeues = models.PositiveIntegerField(default=0)
    # The COMPACTION event this run appended (folded events point at it).
    compaction_event = models.OneToOneField(
        Event, null=True, blank=True, on_delete=models.SET_NULL, related_name="compaction_run"
    )
    # The running summary as it was before this run, restored by a revert.
    previous_summary = models.JSONField(null=True, blank=True)
    # What the run's folded events held and the new context dropped (compaction_app.evidence).
    loss_report = models.JSONField(null=True, blank=True)
    # Its economics, measured on the gateway calls of its thread after it (until the next
    # compaction of the thread): how many, what they cost less (or more) than they would
    # have without it (nanodollars, signed), the first of them and the cache write it paid
    # (compaction_app.economics).
    measured_calls = models.PositiveIntegerField(default=0)
    measured_net_nano_usd = models.BigIntegerField(default=0)
    first_call_id = models.UUIDField(null=True, blank=True)
    first_call_write_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    reverted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"],
                condition=Q(status__in=["pending", "running"]),
                name="one_active_compaction_per_session",
            )
        ]
        indexes = [
            models.Index(fields=["session", "-created_at"]),
            # The sweeper's scan: only active runs, oldest heartbeat first.
            models.Index(
                fields=["heartbeat_at"],
                condition=Q(status__in=["pending", "running"]),
                name="active_run_heartbeat",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.strategy} {self.trigger} {self.status} ({self.session_id})"

    @property
    def reduction_percent(self) -> float | None:
        if not self.tokens_before or self.tokens_after is None:
            return None
        return round(100 * (self.tokens_before - self.tokens_after) / self.tokens_before, 1)

    @property
    def event_reduction_percent(self) -> int | None:
        if not self.events_before or self.events_after is None:
            return None
        return round(100 * (self.events_before - self.events_after) / self.events_before)


class RunningSummary(models.Model):
    """The session's incremental summary: each summarize run extends it."""

    session = models.OneToOneField(
        Session, on_delete=models.CASCADE, related_name="running_summary"
    )
    summary = models.TextField(blank=True, default="")
    summarized_message_ids = models.JSONField(default=list)
    last_summarized_message_id = models.UUIDField(null=True, blank=True)
    token_count = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"summary of {self.session_id}"

    def snapshot(self) -> dict:
        return {
            "summary": self.summary,
            "summarizedMessageIds": list(self.summarized_message_ids),
            "lastSummarizedMessageId": str(self.last_summarized_message_id)
            if self.last_summarized_message_id
            else None,
            "tokenCount": self.token_count,
        }
