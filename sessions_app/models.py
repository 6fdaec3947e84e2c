from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from sessions_app.context_window import WindowLevel, window_level
from sessions_app.event_types import EventType
from sessions_app.session_settings import SessionSettings
from sessions_app.tokens import REPLY_PRIMER


class TokenProvenance(models.TextChoices):
    LOCAL = "local"
    ANTHROPIC_API = "anthropic-api"


# The chat role each event type is sent to the model as. LOCAL_SYSTEM_MESSAGE is for people
# only; it is counted (so its cost is known) but never part of the model's context.
ROLE_FOR_TYPE: dict[str, str] = {
    EventType.SYSTEM_PROMPT: "system",
    EventType.USER_MESSAGE: "user",
    EventType.AGENT_MESSAGE: "assistant",
    EventType.TOOL_CALL: "assistant",
    EventType.TOOL_RESULT: "tool",
    EventType.LOCAL_SYSTEM_MESSAGE: "system",
    EventType.COMPACTION: "system",
    EventType.CONTEXT_REFRESH: "user",
}
MODEL_INVISIBLE_TYPES = frozenset({EventType.LOCAL_SYSTEM_MESSAGE})


def is_model_visible(event_type: str, content: str) -> bool:
    """Whether an event is sent to the model. A COMPACTION event with no summary (a trim's
    marker) is bookkeeping only."""
    if event_type in MODEL_INVISIBLE_TYPES:
        return False
    return not (event_type == EventType.COMPACTION and content == "")


class EventQuerySet(models.QuerySet["Event"]):
    def active(self) -> EventQuerySet:
        """Events in the active context: not folded, model-visible, not a reverted run's."""
        return (
            self.filter(compacted_by__isnull=True, reverted=False)
            .exclude(type__in=MODEL_INVISIBLE_TYPES)
            .exclude(type=EventType.COMPACTION, content="")
        )


class Session(models.Model):
    """A conversation. Counters are maintained by the services inside the append transaction,
    so usage is read from this row without recounting events."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ledger_sessions"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    model = models.CharField(max_length=200)
    encoding = models.CharField(max_length=50)
    context_limit = models.PositiveIntegerField()
    settings = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # --- counters, updated atomically with each append / compaction -----------------------
    last_seq = models.PositiveBigIntegerField(default=0)
    event_count = models.PositiveIntegerField(default=0)
    # Model-visible events not folded by a compaction, and the sum of their token counts.
    active_event_count = models.PositiveIntegerField(default=0)
    active_tokens = models.PositiveBigIntegerField(default=0)
    # Sum of every stored event's tokenCount, folded or not.
    ledger_tokens = models.PositiveBigIntegerField(default=0)
    # Tokens recorded since the last context refresh (see compaction triggers).
    cumulative_tokens = models.PositiveBigIntegerField(default=0)
    # Provider-reported usage, summed over events that carry it.
    reported_prompt_tokens = models.PositiveBigIntegerField(default=0)
    reported_completion_tokens = models.PositiveBigIntegerField(default=0)
    reported_total_tokens = models.PositiveBigIntegerField(default=0)
    reported_event_count = models.PositiveIntegerField(default=0)
    # The provider bill (sessions_app.pricing), summed the same way: cache reads and writes
    # (parts of reported_prompt_tokens), the cost in nanodollars, what fitting kept from being
    # sent and its price; calls whose model has no price leave the cost unknown.
    reported_cached_input_tokens = models.PositiveBigIntegerField(default=0)
    reported_cache_write_tokens = models.PositiveBigIntegerField(default=0)
    cost_nano_usd = models.PositiveBigIntegerField(default=0)
    saved_tokens = models.PositiveBigIntegerField(default=0)
    saved_nano_usd = models.PositiveBigIntegerField(default=0)
    unpriced_calls = models.PositiveIntegerField(default=0)
    unpriced_model = models.CharField(max_length=200, blank=True, default="")
    # Gateway calls (sessions_app.calls.call_record): those the provider answered (the bill
    # counts each, retries included) and those it did not (refused, failed: billed nothing).
    answered_calls = models.PositiveIntegerField(default=0)
    failed_calls = models.PositiveIntegerField(default=0)
    # What the session's compactions saved (or cost, when negative), measured on the gateway
    # calls after each of them (compaction_app.economics), in nanodollars.
    compaction_net_nano_usd = models.BigIntegerField(default=0)
    # Gateway calls the provider answered without usage (a stream that did not ask for it):
    # their estimated price (the gateway's own count, priced), apart from cost_nano_usd.
    estimated_calls = models.PositiveIntegerField(default=0)
    estimated_cost_nano_usd = models.PositiveBigIntegerField(default=0)
    # Snapshot of the latest compaction run, written by compaction_app through a service
    # (sessions_app never imports compaction_app).
    last_compaction = models.JSONField(null=True, blank=True)

    # --- gateway ------------------------------------------------------------------------------
    # The agent's own thread id, when the session was created by the gateway for one.
    client_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # How many of the client's messages the ledger already holds, and the hash of the last of
    # them: the next request is matched from there, so matching costs O(new messages).
    gateway_prefix_len = models.PositiveIntegerField(default=0)
    gateway_prefix_hash = models.CharField(max_length=32, blank=True, default="")
    # Count drift: our count of the last forwarded prompt beside the provider's.
    last_forwarded_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    last_provider_prompt_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    last_serving_model = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "client_key"],
                condition=models.Q(client_key__isnull=False),
                name="session_unique_client_key_per_owner",
            )
        ]

    def __str__(self) -> str:
        return self.title or str(self.id)

    @property
    def context_tokens(self) -> int:
        # The reply primer is counted only when there is something to send.
        return self.active_tokens + REPLY_PRIMER if self.active_event_count else 0

    def window_level(self, context_tokens: int | None = None) -> WindowLevel:
        """How full the session's window is at `context_tokens` (default: the whole active
        context), under its own thresholds: `context_window.window_level`, the one place."""
        settings = SessionSettings.of(self.settings)
        return window_level(
            tokens=self.context_tokens if context_tokens is None else context_tokens,
            window=self.context_limit,
            compact_threshold=settings.compact_threshold,
            hard_threshold=settings.hard_limit_threshold,
        )

    @property
    def percent_used(self) -> float:
        """`percentUsed`: 100 × contextTokens / contextLimit, one decimal."""
        return self.window_level().percent_used


class Event(models.Model):
    """One immutable ledger entry. Only `pinned`, `compacted_by` and the cleared-content
    fields change after insert, and none of them alter the original content."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=32, choices=EventType.choices())
    content = models.TextField(blank=True, default="")
    # True when the client sent structured (non-text) content; `content` then holds its JSON.
    content_is_json = models.BooleanField(default=False)
    name = models.CharField(max_length=200, blank=True, default="")
    tool_call_id = models.CharField(max_length=200, blank=True, default="")
    token_count = models.PositiveIntegerField()
    prompt_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    total_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    # Provider cache reads and writes, parts of prompt_tokens (None: not reported).
    cached_input_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    cache_write_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    pinned = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    # The COMPACTION event that folded this one out of the active context (never deleted).
    compacted_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="folded_events"
    )
    # clear_tool_results swaps the content sent to the model for a placeholder; the original
    # stays in `content`.
    cleared_content = models.TextField(null=True, blank=True)  # noqa: DJ001  (None = not cleared)
    cleared_token_count = models.PositiveIntegerField(null=True, blank=True)
    cleared_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="cleared_events"
    )
    # Set on a COMPACTION event whose run was reverted.
    reverted = models.BooleanField(default=False)
    # Where `token_count` came from: the local tiktoken counter, or Anthropic's count-tokens
    # API, which replaces the local count after ingest (see sessions_app.exact_counts).
    token_provenance = models.CharField(max_length=32, default=TokenProvenance.LOCAL)
    # The exact count as the API answered it, and the count of the whole request up to and
    # including this event (the next event's cost is measured against it).
    exact_token_count = models.PositiveIntegerField(null=True, blank=True)
    exact_cumulative_count = models.PositiveBigIntegerField(null=True, blank=True)
    # The gateway's hash of the client message this event came from (role, content, tool ids):
    # a resent history is matched against it.
    message_hash = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="event_unique_seq_per_session"),
        ]
        indexes = [
            models.Index(fields=["session", "compacted_by", "seq"], name="event_active_idx"),
            models.Index(fields=["session", "type", "seq"], name="event_type_idx"),
            models.Index(fields=["session", "message_hash"], name="event_message_hash_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.type}"

    @property
    def role(self) -> str:
        return ROLE_FOR_TYPE[self.type]

    @property
    def effective_token_count(self) -> int:
        return (
            self.cleared_token_count if self.cleared_token_count is not None else self.token_count
        )


class Thread(models.Model):
    """One writer's conversation inside a session (the gateway's main loop, a side call, a
    sub-agent, a parallel worker). Its events carry its `key` in `metadata["thread"]`; the row
    keeps what the gateway needs to match the next request and what the session page shows."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="threads")
    # Derived from the conversation's first new message (stable under retries), or the
    # client's own name from `X-Ledger-Thread`.
    key = models.CharField(max_length=200)
    named = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    calls = models.PositiveIntegerField(default=0)
    # The thread's history as last seen: how many messages, the last one's hash and the chain
    # hash of the whole (the next request usually continues exactly this).
    length = models.PositiveIntegerField(default=0)
    last_hash = models.CharField(max_length=32, blank=True, default="")
    last_chain = models.CharField(max_length=32, blank=True, default="")
    # The chain hash of the history before the last call's reply (the request it answered):
    # a retry of that call (the same request again) is matched from it, not message by message.
    request_chain = models.CharField(max_length=32, blank=True, default="")
    # The thread's first own message (where and its hash): a request must carry it as well
    # as the last one to continue the thread the cheap way (parallel workers may share
    # replies word for word, never their first own message: that names the thread).
    anchor_index = models.PositiveIntegerField(default=0)
    anchor_hash = models.CharField(max_length=32, blank=True, default="")
    # What the thread's last call forwarded (tokens) and how it was fitted.
    context_tokens = models.PositiveBigIntegerField(default=0)
    last_fit = models.CharField(max_length=32, blank=True, default="")
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    # The last bookkeeping failure (the call itself went through), shown on the session page.
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "key"], name="thread_unique_key_per_session")
        ]

    def __str__(self) -> str:
        return f"{self.session_id}/{self.key}"


class CallStatus(models.TextChoices):
    """How a gateway call ended, from the client's side."""

    OK = "ok"  # the provider answered with a reply
    PROVIDER_ERROR = "provider_error"  # the provider answered with an error status or event
    REFUSED = "refused"  # the gateway refused it (e.g. context_length_exceeded), nothing sent
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"  # no provider could be reached
    TIMEOUT = "timeout"  # the provider did not answer in time
    INTERRUPTED = "interrupted"  # the provider broke off its streamed answer
    CLIENT_DISCONNECTED = "client_disconnected"  # the client went away before the end


ERROR_STATUSES = frozenset(set(CallStatus) - {CallStatus.OK})


class Call(models.Model):
    """One provider call through the gateway, whatever its outcome: the row people check first
    (latency, status, tokens, cost). Written after the response is sent (never on the call's
    hot path); the reply itself is in the session's events (`reply_seq`)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # None: refused before any session existed (a first call naming an unknown model, bad
    # JSON, no X-Ledger-Session); its `session_key` joins it to the session that key later
    # creates. Every call has the owner of the API token it came with: who may see it.
    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name="calls", null=True, blank=True
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="ledger_calls",
        null=True,
        blank=True,
    )
    # The X-Ledger-Session the client sent (a session id or its own key).
    session_key = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField()
    wire = models.CharField(max_length=32)
    thread = models.CharField(max_length=200, blank=True, default="")
    model_requested = models.CharField(max_length=200, blank=True, default="")
    model_served = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=32, choices=CallStatus.choices)
    # The HTTP status the client got (None: it went away before an answer).
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_code = models.CharField(max_length=100, blank=True, default="")
    error = models.CharField(max_length=500, blank=True, default="")
    stream = models.BooleanField(default=False)
    # Milliseconds from the request's arrival to the provider's first byte (a stream's first
    # chunk; otherwise its response headers), and to the end of the answer.
    ttfb_ms = models.PositiveIntegerField(null=True, blank=True)
    total_ms = models.PositiveIntegerField(null=True, blank=True)
    # The provider's usage (None: not reported); cached and cache write are parts of prompt.
    prompt_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    cached_input_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    cache_write_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    cache_write_1h_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    # Part of completion_tokens the model spent reasoning (None: not reported).
    reasoning_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    # "reported": the figures above are the provider's; "absent": the provider answered but
    # sent no usage (a stream without it), and the figures are the gateway's own count of
    # what was forwarded and replied (`cost_estimated`); "": no reply.
    usage_status = models.CharField(max_length=16, blank=True, default="")
    # The call's price (None: no usage, or the model has no price), and by token kind
    # (sessions_app.pricing.Breakdown.document()).
    cost_nano_usd = models.PositiveBigIntegerField(null=True, blank=True)
    cost_estimated = models.BooleanField(default=False)
    cost_by_kind = models.JSONField(default=dict, blank=True)
    # Why this call hit or missed the provider's prompt cache (compaction_app.gateway.
    # cache_outcome): hit | partial | miss | not_cacheable ("": not predicted), the reason,
    # and the whole document (first changed message, the provider's figures, disagreement).
    cache_outcome = models.CharField(max_length=16, blank=True, default="")
    cache_reason = models.CharField(max_length=32, blank=True, default="")
    cache = models.JSONField(null=True, blank=True)
    # What the call forwarded, as far as the provider's prompt cache cares: the next call of
    # its thread is compared with it (compaction_app.gateway.cache_outcome). Digests, not
    # bodies: 12 hex characters per message, 8 per kept content block, one-letter roles, the cache
    # breakpoints, the model and the tools' digest. Not for display: lists defer it.
    prefix = models.JSONField(null=True, blank=True)
    # Fitting: whether what was forwarded differs from what the client sent, our count of
    # what was forwarded, and what fitting kept from being sent (client's request − forwarded).
    fitted = models.BooleanField(default=False)
    forwarded_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    saved_tokens = models.PositiveBigIntegerField(default=0)
    # Every model tried, in order: [{"model", "outcome", "httpStatus"?}]; more than one is a
    # failover.
    attempts = models.JSONField(default=list, blank=True)
    # Usage figures the provider reported that are not in the token columns, with why
    # (sessions_app/usage_bounds.py): {"promptTokens": "10000000000000 is out of range ..."}.
    usage_dropped = models.JSONField(default=dict, blank=True)
    # The reply's first event (its id is derived before it is stored, so the call is written
    # without looking it up; None: no reply). Readers resolve its seq (calls.with_reply_seq).
    reply_event_id = models.UUIDField(null=True, blank=True)
    # Milliseconds from the request's arrival to its first send upstream: the gateway's own
    # time before the provider (None: never forwarded).
    gateway_ms = models.PositiveIntegerField(null=True, blank=True)
    # The request's and the response's headers the call page shows: an allowlist, every
    # credential masked before it is stored (sessions_app.call_story.masked_headers).
    headers = models.JSONField(default=dict, blank=True)
    # How fitting treated the request: {"how": as_sent|fitted|compacted|pruned|ledger|off,
    # "pruned": [[first, last], ...] request indices a per-call prune dropped, when known}.
    fit = models.JSONField(default=dict, blank=True)
    # Where the request's messages are in the ledger, so the call page rebuilds them without a
    # second copy of any body: {"after": the event id of the last message it continued (a
    # previous call's reply or message), "seqs": [[first, last], ...] the events of its own new
    # messages, "messages": how many it sent, "replyParts": events of its reply}.
    request_map = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-started_at", "id"]
        indexes = [
            models.Index(fields=["session", "-started_at"], name="call_session_time_idx"),
            models.Index(fields=["-started_at"], name="call_time_idx"),
            models.Index(fields=["owner", "-started_at"], name="call_owner_time_idx"),
            # A call's predecessor in its thread (the cache outcome's comparison).
            models.Index(fields=["session", "thread", "-started_at"], name="call_thread_time_idx"),
        ]

    def __str__(self) -> str:
        where = self.session_id or f"(no session) {self.session_key}"
        return f"{where} {self.started_at:%Y-%m-%d %H:%M:%S} {self.status}"

    @property
    def failovers(self) -> int:
        return max(len(self.attempts or []) - 1, 0)


class CallRollupBucket(models.Model):
    """A 15-minute window of calls (by start) whose rollup rows are stored. Written first in
    the transaction that stores them, so a late call (one saved after its window closed)
    that deletes it waits for that transaction and the window is computed again on the next
    read (sessions_app.call_rollup)."""

    bucket = models.DateTimeField(primary_key=True)
    computed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.bucket:%Y-%m-%d %H:%M}"


class CallRollup(models.Model):
    """The calls of one 15-minute window for one session, model, status, wire and stream:
    counts, tokens by kind, cost and latency histograms. What the usage pages and /metrics
    read instead of every call (sessions_app.call_rollup). A deleted session's rows stay,
    without it: the money was spent."""

    bucket = models.ForeignKey(
        CallRollupBucket, on_delete=models.CASCADE, related_name="rows", db_column="bucket"
    )
    session = models.ForeignKey(
        Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    model = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=32)
    wire = models.CharField(max_length=32)
    stream = models.BooleanField(default=False)
    calls = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_input_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cost_nano_usd = models.PositiveBigIntegerField(default=0)
    unpriced_calls = models.PositiveIntegerField(default=0)
    fitted = models.PositiveIntegerField(default=0)
    saved_tokens = models.PositiveBigIntegerField(default=0)
    # {"total" | "ttfb" | "gateway": {"sum": ms, "count": n, "h": {edge index: n}}}
    latency = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["bucket", "owner"], name="call_rollup_bucket_idx")]

    def __str__(self) -> str:
        return f"{self.bucket_id} {self.model} {self.status} × {self.calls}"


class RollupLevel(models.TextChoices):
    """A coarser rollup level than the 15-minute window (sessions_app.call_rollup)."""

    HOUR = "hour"
    DAY = "day"


class CallRollupSpan(models.Model):
    """An hour or a day (UTC) whose coarse rollup rows are stored: built once each of its
    windows (hours, for a day) is stored, written first in the transaction that stores its
    rows; a late call deletes it with its window's marker (sessions_app.call_rollup)."""

    level = models.CharField(max_length=8, choices=RollupLevel.choices)
    start = models.DateTimeField()
    computed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["level", "start"], name="call_rollup_span_unique")
        ]

    def __str__(self) -> str:
        return f"{self.level} {self.start:%Y-%m-%d %H:%M}"


class CallRollupCoarse(models.Model):
    """The calls of one hour or day (UTC) for one owner, model and status: the 15-minute
    rows of its windows summed (sessions, wires and streams together), what a usage read
    that is not per session reads instead (sessions_app.call_rollup). `level` and `start`
    repeat the span's, so a read is one range on one index."""

    span = models.ForeignKey(CallRollupSpan, on_delete=models.CASCADE, related_name="rows")
    level = models.CharField(max_length=8, choices=RollupLevel.choices)
    start = models.DateTimeField()
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    model = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=32)
    calls = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_input_tokens = models.PositiveBigIntegerField(default=0)
    cache_write_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    cost_nano_usd = models.PositiveBigIntegerField(default=0)
    unpriced_calls = models.PositiveIntegerField(default=0)
    fitted = models.PositiveIntegerField(default=0)
    saved_tokens = models.PositiveBigIntegerField(default=0)
    # As CallRollup.latency, the call's total latency only ({"total": ...}: usage's p50/p99).
    latency = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["level", "start", "owner"], name="call_rollup_coarse_idx")]

    def __str__(self) -> str:
        return f"{self.level} {self.start:%Y-%m-%d %H:%M} {self.model} {self.status} × {self.calls}"


class CallSeriesTotal(models.Model):
    """Every stored 15-minute window's calls for one wire, model, status and stream, summed:
    what /metrics reads (one row per series) beside the calls of the windows not stored yet.
    Added to in the transaction that stores a window, taken from in the one that drops a
    window for a late call (sessions_app.call_rollup), so it always equals the stored
    windows."""

    wire = models.CharField(max_length=32)
    model = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=32)
    stream = models.BooleanField(default=False)
    calls = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    cached_input_tokens = models.BigIntegerField(default=0)
    cache_write_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    cost_nano_usd = models.BigIntegerField(default=0)
    unpriced_calls = models.BigIntegerField(default=0)
    fitted = models.BigIntegerField(default=0)
    saved_tokens = models.BigIntegerField(default=0)
    # As CallRollup.latency.
    latency = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["wire", "model", "status", "stream"], name="call_series_total_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.wire} {self.model} {self.status} × {self.calls}"


class BudgetPeriod(models.TextChoices):
    """The calendar period a budget's spend is counted over (UTC)."""

    DAY = "day"
    WEEK = "week"  # from Monday 00:00 UTC
    MONTH = "month"


class Budget(models.Model):
    """A spend limit on a user's gateway calls over a period: all of them (`client_key` ""),
    or those of one gateway client key (`X-Ledger-Session`: one agent of several). Counted
    in the database, so every server process sees the same spend (sessions_app.budgets):
    what the current period's settled calls cost, and what the calls in flight reserved."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ledger_budgets"
    )
    client_key = models.CharField(max_length=200, blank=True, default="")
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    limit_nano_usd = models.PositiveBigIntegerField()
    # The period the counters are for; a call in a later period starts them again.
    period_start = models.DateTimeField()
    spent_nano_usd = models.BigIntegerField(default=0)
    reserved_nano_usd = models.BigIntegerField(default=0)
    in_flight = models.IntegerField(default=0)
    # When a call last reserved: a process that died with calls in flight leaves reservations
    # no call will settle; they lapse after sessions_app.budgets.RESERVATION_LAPSE.
    reserved_at = models.DateTimeField(null=True, blank=True)
    # The period's alerts, sent once each (80 % and 100 % of the limit).
    alerted_80 = models.BooleanField(default=False)
    alerted_100 = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["user_id", "client_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "client_key"], name="budget_unique_per_user_and_key"
            )
        ]

    def __str__(self) -> str:
        scope = f" / {self.client_key}" if self.client_key else ""
        return f"budget of user {self.user_id}{scope} ({self.period})"
