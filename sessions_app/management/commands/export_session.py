"""Export a session as a JSONL file of OpenAI-style chat messages (the format import_session
reads).

By default the active context is written, in the order /context sends it: the system prompt,
the running summary (a system message), then every event not folded. ``--include-compacted``
writes the whole conversation as recorded instead: every event, folded or not, and no
summaries. LOCAL_SYSTEM_MESSAGE events are for
people, not the model, and have no chat role: they are left out. Content is the original
text (a cleared tool result exports what the tool returned).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app import render
from sessions_app.models import Event, EventType, Session
from sessions_app.selectors import event_record


def events_to_messages(events: Iterable[Event], *, include_summaries: bool) -> list[dict[str, Any]]:
    """Chat messages for ledger events (seq order), through the renderer /context uses: the
    same order (system prompt, summary, the rest) and the same repairs of unpaired tool
    calls and results. Contents are the originals."""
    records = [
        event_record(event, original=True)
        for event in events
        if include_summaries or event.type != EventType.COMPACTION
    ]
    return render.to_openai(records, tool_result_names=True).messages


class Command(BaseCommand):
    help = "Export a session as JSONL chat messages (the format import_session reads)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("session_id", help="the session's id")
        parser.add_argument(
            "--out", type=Path, default=None, help="output file (default: standard output)"
        )
        parser.add_argument(
            "--include-compacted",
            action="store_true",
            help="write every event, including those folded by compactions (and no summaries)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            session = Session.objects.get(pk=uuid.UUID(options["session_id"]))
        except (ValueError, Session.DoesNotExist):
            raise CommandError(f"no session {options['session_id']!r}") from None
        include = options["include_compacted"]
        events = Event.objects.filter(session=session).order_by("seq")
        if not include:
            events = events.active()
        messages = events_to_messages(
            events.iterator(chunk_size=2000), include_summaries=not include
        )
        out: Path | None = options["out"]
        count = 0
        if out is None:
            stream = getattr(self.stdout, "_out", sys.stdout)
            for message in messages:
                stream.write(json.dumps(message, ensure_ascii=False) + "\n")
                count += 1
        else:
            try:
                with out.open("w", encoding="utf-8") as handle:
                    for message in messages:
                        handle.write(json.dumps(message, ensure_ascii=False) + "\n")
                        count += 1
            except OSError as exc:
                raise CommandError(f"cannot write {out}: {exc.strerror}") from None
        self.stderr.write(f"Exported {count} messages from session {session.pk}")
