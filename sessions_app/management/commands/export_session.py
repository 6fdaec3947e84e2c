"""Export a session as a JSONL file of OpenAI-style chat messages (the format import_session
reads).

By default the active ledger is written: events not folded by a compaction, with each live
summary as a system message. ``--include-compacted`` writes the whole conversation as recorded
instead: every event, folded or not, and no summaries. LOCAL_SYSTEM_MESSAGE events are for
people, not the model, and have no chat role: they are left out. Content is the original
text (a cleared tool result exports what the tool returned).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from sessions_app.models import Event, EventType, Session

_ROLES: dict[str, str] = {
    EventType.SYSTEM_PROMPT: "system",
    EventType.USER_MESSAGE: "user",
    EventType.CONTEXT_REFRESH: "user",
    EventType.AGENT_MESSAGE: "assistant",
    EventType.COMPACTION: "system",
}


def _original(event: Event) -> Any:
    return json.loads(event.content) if event.content_is_json else event.content


def events_to_messages(
    events: Iterable[Event], *, include_summaries: bool
) -> Iterator[dict[str, Any]]:
    """Chat messages for ledger events in seq order; an assistant's text and the tool calls
    right after it form one message, as in OpenAI's format."""
    pending: dict[str, Any] | None = None
    for event in events:
        if event.type == EventType.TOOL_CALL:
            content = _original(event)
            call = {
                "id": event.tool_call_id,
                "type": "function",
                "function": {
                    "name": event.name,
                    "arguments": content
                    if isinstance(content, str)
                    else json.dumps(content, ensure_ascii=False),
                },
            }
            if pending is None:
                pending = {"role": "assistant", "content": None}
            pending.setdefault("tool_calls", []).append(call)
            continue
        if pending is not None:
            yield pending
            pending = None
        if event.type == EventType.LOCAL_SYSTEM_MESSAGE:
            continue
        if event.type == EventType.COMPACTION and (
            not include_summaries or not event.content or event.reverted
        ):
            continue
        if event.type == EventType.TOOL_RESULT:
            message: dict[str, Any] = {
                "role": "tool",
                "tool_call_id": event.tool_call_id,
                "content": _original(event),
            }
            if event.name:
                message["name"] = event.name
            yield message
            continue
        message = {"role": _ROLES[event.type], "content": _original(event)}
        if event.name and event.type != EventType.COMPACTION:
            message["name"] = event.name
        if event.type == EventType.AGENT_MESSAGE:
            # Held back: tool calls that follow join this message.
            pending = message
            continue
        yield message
    if pending is not None:
        yield pending


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
            events = events.filter(compacted_by__isnull=True)
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
