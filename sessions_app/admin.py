"""Django admin for the ledger: sessions (title and window editable, counters read-only) and
events (view only: the ledger is append-only, so nothing is added, changed or deleted here)."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from sessions_app import scope, services
from sessions_app.errors import LedgerError
from sessions_app.models import Call, Event, Session
from sessions_app.pricing import usd_text
from sessions_app.signals import session_compaction_requested


def _as_uuid(term: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = (
        "display_title",
        "owner",
        "model",
        "context_usage",
        "bill",
        "events_link",
        "updated_at",
    )
    list_filter = ("model",)
    list_select_related = ("owner",)
    # A UUID in the search box matches the session id (see get_search_results).
    search_fields = ("title", "owner__username")
    search_help_text = "Session id, title or owner username."
    ordering = ("-updated_at",)
    actions = ("compact_now",)
    fields = (
        "id",
        "title",
        "owner",
        "model",
        "encoding",
        "context_limit",
        "settings",
        "context_usage",
        "bill",
        "event_count",
        "active_event_count",
        "active_tokens",
        "ledger_tokens",
        "cumulative_tokens",
        "reported_prompt_tokens",
        "reported_completion_tokens",
        "reported_total_tokens",
        "reported_event_count",
        "last_seq",
        "last_compaction",
        "created_at",
        "updated_at",
    )
    # Only the title and the window are edited here, through the service that validates them;
    # the counters belong to the append and compaction transactions.
    readonly_fields = tuple(f for f in fields if f not in ("title", "context_limit"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Sessions are created through the API or import_session (encoding, system prompt).
        return False

    @admin.display(description="title", ordering="title")
    def display_title(self, obj: Session) -> str:
        return obj.title or str(obj.pk)

    @admin.display(description="context tokens / limit (main thread)")
    def context_usage(self, obj: Session) -> str:
        # sessions_app.scope: the figure REST /usage, the dashboard and MCP show.
        context = scope.context_figures(session=obj)
        text = f"{context.context_tokens:,} / {context.context_limit:,} ({context.percent_used}%)"
        return f"{text} · thread {context.thread}" if context.thread else text

    @admin.display(description="bill (all threads)")
    def bill(self, obj: Session) -> str:
        bill = scope.bill_figures(session=obj, with_calls=False)
        text = (
            f"{bill.prompt_tokens:,} prompt + {bill.completion_tokens:,} completion = "
            f"{bill.total_tokens:,} tokens · {usd_text(bill.cost_usd)}"
        )
        if bill.unpriced_calls:
            text += f" + {scope.unpriced_text(bill.unpriced_calls)}"
        return text

    @admin.display(description="events", ordering="event_count")
    def events_link(self, obj: Session) -> str:
        url = reverse("admin:sessions_app_event_changelist") + f"?session__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, obj.event_count)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Session], search_term: str
    ) -> tuple[QuerySet[Session], bool]:
        key = _as_uuid(search_term)
        if key is not None:
            return queryset.filter(pk=key), False
        return super().get_search_results(request, queryset, search_term)

    def save_model(self, request: HttpRequest, obj: Session, form: Any, change: bool) -> None:
        try:
            services.session_update(session=obj, title=obj.title, context_limit=obj.context_limit)
        except LedgerError as exc:
            self.message_user(request, f"Not saved: {exc.detail}", level=messages.ERROR)

    @admin.action(description="Compact selected sessions")
    def compact_now(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        responses = session_compaction_requested.send(
            sender=Session, session_ids=ids, user=request.user
        )
        started = sum(len(response or []) for _receiver, response in responses)
        if not responses:
            self.message_user(request, "Compaction is not installed.", level=messages.WARNING)
        else:
            self.message_user(
                request,
                f"Started {started} compaction(s) for {len(ids)} session(s); sessions with a run "
                "already under way were skipped.",
            )


class CompactedFilter(admin.SimpleListFilter):
    title = "compacted"
    parameter_name = "compacted"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Folded by a compaction"), ("no", "Active")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Event]) -> QuerySet[Event]:
        if self.value() == "yes":
            return queryset.filter(compacted_by__isnull=False)
        if self.value() == "no":
            return queryset.filter(compacted_by__isnull=True)
        return queryset


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("session", "seq", "type", "token_count", "pinned", "compacted")
    list_filter = ("type", "pinned", CompactedFilter)
    list_select_related = ("session",)
    # A UUID matches the session id or the event id (see get_search_results).
    search_fields = ("name", "tool_call_id")
    search_help_text = "Session id, event id, tool name or tool call id."
    ordering = ("session", "seq")
    readonly_fields = (
        "id",
        "session",
        "seq",
        "type",
        "content",
        "content_is_json",
        "name",
        "tool_call_id",
        "token_count",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "pinned",
        "metadata",
        "compacted_by",
        "cleared_content",
        "cleared_token_count",
        "cleared_by",
        "reverted",
        "created_at",
    )
    fields = readonly_fields

    @admin.display(boolean=True, description="compacted")
    def compacted(self, obj: Event) -> bool:
        return obj.compacted_by_id is not None

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Event], search_term: str
    ) -> tuple[QuerySet[Event], bool]:
        key = _as_uuid(search_term)
        if key is not None:
            return queryset.filter(Q(session_id=key) | Q(pk=key)), False
        return super().get_search_results(request, queryset, search_term)

    # The ledger is append-only: events are viewed here, never added, edited or deleted.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Event | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Event | None = None) -> bool:
        return False


@admin.register(Call)
class CallAdmin(admin.ModelAdmin):
    """Gateway calls, read-only (the dashboard's calls table is the place to read them)."""

    list_display = (
        "started_at",
        "session",
        "thread",
        "model_requested",
        "model_served",
        "status",
        "http_status",
        "ttfb_ms",
        "total_ms",
        "prompt_tokens",
        "completion_tokens",
    )
    list_filter = ("status", "wire", "stream", "fitted")
    list_select_related = ("session",)
    search_fields = ("model_requested", "model_served", "thread", "error_code")
    ordering = ("-started_at",)
    readonly_fields = tuple(f.name for f in Call._meta.get_fields() if f.concrete)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
