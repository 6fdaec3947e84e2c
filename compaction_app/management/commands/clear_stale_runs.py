"""`manage.py clear_stale_runs`: run the stale-run sweep once, or clear given runs by hand.

manage.py clear_stale_runs                     # the sweep Celery beat runs periodically
manage.py clear_stale_runs --older-than 30     # … with a shorter stale window
manage.py clear_stale_runs --run <run-id> ...  # fail these pending/running runs now
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from compaction_app.models import CompactionRun
from compaction_app.sweeper import clear_runs, sweep_stale_runs


def _run_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise CommandError(f"not a compaction id: {value!r}") from None


class Command(BaseCommand):
    help = (
        "Fail running compactions whose worker stopped beating and re-queue pending ones whose "
        "task was lost; with --run, fail the given pending or running compactions by hand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--run",
            action="append",
            default=[],
            metavar="ID",
            help="a compaction id to fail now, however recent its heartbeat (repeatable)",
        )
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            metavar="SECONDS",
            help="stale window of the sweep (default COMPACTION_STALE_SECONDS)",
        )

    def handle(self, *args: Any, run: list[str], older_than: float | None, **options: Any) -> None:
        if run:
            ids = [_run_id(value) for value in run]
            known = {
                str(pk): status
                for pk, status in CompactionRun.objects.filter(pk__in=ids).values_list(
                    "pk", "status"
                )
            }
            missing = [str(pk) for pk in ids if str(pk) not in known]
            if missing:
                raise CommandError(f"no compaction with id {', '.join(missing)}")
            cleared = set(clear_runs(run_ids=ids, cleared_by="manage.py clear_stale_runs"))
            for pk in ids:
                if str(pk) in cleared:
                    self.stdout.write(f"{pk}: failed (was {known[str(pk)]})")
                else:
                    self.stdout.write(f"{pk}: left alone, already {known[str(pk)]}")
            return
        if older_than is not None and older_than < 0:
            raise CommandError("--older-than must be >= 0")
        result = sweep_stale_runs(stale_seconds=older_than)
        for failed_id in result.failed:
            self.stdout.write(f"{failed_id}: failed (stale)")
        for requeued_id in result.requeued:
            self.stdout.write(f"{requeued_id}: queued again")
        self.stdout.write(
            f"Swept: {len(result.failed)} failed, {len(result.requeued)} queued again."
        )
