"""Django admin for compaction runs: history to inspect (read-only) and a way to clear a run
whose worker is gone, for the operator who cannot wait for the sweeper."""

from __future__ import annotations

import uuid

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from compaction_app.models import CompactionRun
from compaction_app.run_documents import tokens_text
from compaction_app.sweeper import clear_runs


@admin.register(CompactionRun)
class CompactionRunAdmin(admin.ModelAdmin):
    # Narrow columns (a short id, a shortened title; the heartbeat on the run's own page) so
    # the list fits a 1,400 px window with the admin's sidebar open.
    list_display = (
        "short_id",
        "session_title",
        "scope",
        "strategy",
        "trigger",
        "status",
        "created_at",
        "tokens",
    )
    list_display_links = ("short_id",)
    list_filter = ("status", "trigger", "strategy")
    list_select_related = ("session",)
    # A UUID in the search box matches the run id or the session id (get_search_results).
    search_fields = ("error",)
    search_help_text = "Compaction id, session id, or text of the error."
    ordering = ("-created_at",)
    actions = ("clear_selected",)
    readonly_fields = tuple(
        f.name for f in CompactionRun._meta.get_fields() if f.concrete and not f.many_to_many
    )

    @admin.display(description="id", ordering="id")
    def short_id(self, run: CompactionRun) -> str:
        return str(run.pk)[:8]

    @admin.display(description="session", ordering="session__title")
    def session_title(self, run: CompactionRun) -> str:
        title = str(run.session)
        return title if len(title) <= 32 else title[:31] + "…"

    @admin.display(description="context of")
    def scope(self, run: CompactionRun) -> str:
        # A run's tokens are its thread's context (sessions_app.scope), or the whole ledger's.
        return f"thread {run.thread[:16]}" if run.thread else "session"

    @admin.display(description="Tokens before → after", ordering="tokens_before")
    def tokens(self, run: CompactionRun) -> str:
        return tokens_text(run)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[CompactionRun], search_term: str
    ) -> tuple[QuerySet[CompactionRun], bool]:
        try:
            key = uuid.UUID(search_term.strip())
        except ValueError:
            return super().get_search_results(request, queryset, search_term)
        return queryset.filter(Q(pk=key) | Q(session_id=key)), False

    # Runs are created by compaction requests and changed only by their worker (or a clear).
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: CompactionRun | None = None) -> bool:
        return False

    @admin.action(
        description="Fail selected pending/running runs (their worker is gone)",
        permissions=["change"],
    )
    def clear_selected(self, request: HttpRequest, queryset: QuerySet[CompactionRun]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        cleared = clear_runs(run_ids=ids, cleared_by=f"admin, {request.user.get_username()}")
        skipped = len(ids) - len(cleared)
        self.message_user(
            request,
            f"Failed {len(cleared)} run(s); {skipped} already finished run(s) left as they were.",
            level=messages.SUCCESS if cleared else messages.WARNING,
        )
