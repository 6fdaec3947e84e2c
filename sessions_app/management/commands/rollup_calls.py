"""`manage.py rollup_calls`: roll up the gateway's calls ahead of the first usage read.

Usage reads roll up closed windows as they meet them, at most `STORE_PER_READ` a read (the
rest computed from the calls that time), so the first read over a large, never-read ledger
pays for it (about 30 s for a million calls). Run this once after an import or an upgrade,
or from cron, to store every closed window, hour and day beforehand; it is idempotent and
safe beside running servers (each window is stored once, by whoever takes it first)."""

from __future__ import annotations

import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Min
from django.utils import timezone

from sessions_app import call_rollup
from sessions_app.models import Call


class Command(BaseCommand):
    help = "Store the usage rollups of every closed window (15 minutes), hour and day of calls."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="Only the last N days (default: since the oldest call).",
        )

    def handle(self, *args: Any, days: int | None, **options: Any) -> None:
        now = timezone.now()
        if days is not None:
            if days <= 0:
                raise CommandError("--days takes a positive number of days")
            since = now - datetime.timedelta(days=days)
        else:
            oldest = Call.objects.aggregate(oldest=Min("started_at"))["oldest"]
            if oldest is None:
                self.stdout.write("No calls: nothing to roll up.")
                return
            since = oldest
        stored = call_rollup.roll_up(since=since, until=now)
        self.stdout.write(
            f"{stored} windows rolled up since {since:%Y-%m-%d %H:%M} UTC "
            "(with the hours and days they complete)."
        )
