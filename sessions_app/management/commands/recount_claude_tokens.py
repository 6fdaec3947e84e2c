"""`manage.py recount_claude_tokens`: count existing Claude sessions with Anthropic's
count-tokens API (needs ANTHROPIC_API_KEY and LEDGER_ANTHROPIC_COUNT_TOKENS=true)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from sessions_app.exact_counts import CountError, count_client, count_session_exactly
from sessions_app.models import Event, Session, TokenProvenance


class Command(BaseCommand):
    help = "Replace the local token counts of Claude sessions by Anthropic's exact counts."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--session", action="append", default=[], help="Only this session id.")
        parser.add_argument(
            "--force", action="store_true", help="Recount events that already have exact counts."
        )

    def handle(self, *args: Any, session: list[str], force: bool, **options: Any) -> None:
        from sessions_app.exact_counts import exact_counting_enabled

        if not exact_counting_enabled(model="claude"):
            raise CommandError("set ANTHROPIC_API_KEY and LEDGER_ANTHROPIC_COUNT_TOKENS=true first")
        sessions = Session.objects.filter(model__icontains="claude").order_by("created_at")
        if session:
            sessions = sessions.filter(pk__in=session)
        client = count_client()
        counted = failed = 0
        for item in tqdm(list(sessions), desc="Claude sessions", unit="session", file=self.stderr):
            if force:
                Event.objects.filter(session=item).update(
                    token_provenance=TokenProvenance.LOCAL, exact_cumulative_count=None
                )
            try:
                counted += count_session_exactly(session_id=item.pk, client=client)
            except CountError as exc:
                failed += 1
                self.stderr.write(f"session {item.pk}: {exc} (local counts kept)")
        self.stdout.write(f"{counted} events counted exactly; {failed} sessions failed.")
