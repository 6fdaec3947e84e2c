"""Import a conversation from a JSONL file of OpenAI-style chat messages into a new session.

One message per line: ``{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?}``.
system → SYSTEM_PROMPT, user → USER_MESSAGE, tool → TOOL_RESULT; an assistant message becomes
an AGENT_MESSAGE for its text and one TOOL_CALL per ``tool_calls`` entry. The whole file is
validated before anything is written, and the import is one transaction: a bad line stores
nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from tqdm import tqdm

from config.celery import tasks_inline_unless_broker_outlives_process
from sessions_app import services
from sessions_app.errors import LedgerError
from sessions_app.models import EventType, Session
from sessions_app.services import EventInput

BATCH_SIZE = 500
ROLE_TYPES = {
    "system": EventType.SYSTEM_PROMPT,
    "user": EventType.USER_MESSAGE,
    "tool": EventType.TOOL_RESULT,
}


class LineError(ValueError):
    pass


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise LineError(f"{what} must be a string")
    try:
        services.check_text(value, what)
    except LedgerError as exc:
        reason = next(iter((exc.extra.get("fields") or {}).values()), exc.detail)
        raise LineError(f"{what} {reason}") from None
    return value


def _content(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value, "content")
    if isinstance(value, list | dict):
        # Structured parts are stored as JSON; the same text checks apply inside them.
        try:
            services.check_text(json.dumps(value, ensure_ascii=False), "content")
        except (LedgerError, UnicodeEncodeError):
            raise LineError("content contains a NUL byte or a lone surrogate") from None
        return value
    raise LineError("content must be a string, a list of parts or null")


def message_to_events(message: Any) -> list[EventInput]:
    """The ledger events for one chat message (raises LineError on a malformed message)."""
    if not isinstance(message, dict):
        raise LineError("a line must be a JSON object")
    role = message.get("role")
    raw_content = message.get("content")
    name = _text(message["name"], "name") if message.get("name") is not None else ""
    if role in ("system", "user"):
        if raw_content is None:
            raise LineError(f"a {role} message needs content")
        return [EventInput(type=ROLE_TYPES[role], content=_content(raw_content), name=name)]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not call_id:
            raise LineError("a tool message needs tool_call_id")
        content = _content(raw_content if raw_content is not None else "")
        return [
            EventInput(
                type=EventType.TOOL_RESULT,
                content=content,
                name=name,
                tool_call_id=_text(call_id, "tool_call_id"),
            )
        ]
    if role == "assistant":
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise LineError("tool_calls must be a list")
        events: list[EventInput] = []
        if raw_content not in (None, "") or not calls:
            events.append(
                EventInput(
                    type=EventType.AGENT_MESSAGE, content=_content(raw_content or ""), name=name
                )
            )
        for index, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not call.get("id") or not function.get("name"):
                raise LineError(f"tool_calls[{index}] needs an id and a function with a name")
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            events.append(
                EventInput(
                    type=EventType.TOOL_CALL,
                    content=_text(arguments, f"tool_calls[{index}].function.arguments"),
                    name=_text(function["name"], f"tool_calls[{index}].function.name"),
                    tool_call_id=_text(call["id"], f"tool_calls[{index}].id"),
                )
            )
        return events
    raise LineError(f"unknown role {role!r} (expected system, user, assistant or tool)")


def read_messages(path: Path) -> list[tuple[int, EventInput]]:
    """Every event of the file with the line it came from; blank lines are skipped."""
    events: list[tuple[int, EventInput]] = []
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CommandError(
                        f"{path}, line {number}: not valid JSON ({exc.msg})"
                    ) from None
                try:
                    events.extend((number, event) for event in message_to_events(message))
                except LineError as exc:
                    raise CommandError(f"{path}, line {number}: {exc}") from None
        except UnicodeDecodeError:
            raise CommandError(f"{path}: not valid UTF-8") from None
    return events


class Command(BaseCommand):
    help = "Import a JSONL file of OpenAI-style chat messages into a new session."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="JSONL file, one chat message per line")
        parser.add_argument("--user", required=True, help="username of the session's owner")
        parser.add_argument("--model", required=True, help="model name, e.g. gpt-4o")
        parser.add_argument("--title", default=None, help="session title (default: the file name)")
        parser.add_argument(
            "--context-limit",
            type=int,
            default=None,
            help="context window; needed for unknown models",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH_SIZE,
            help="events per append (default %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> str:
        path: Path = options["file"]
        try:
            owner = get_user_model().objects.get(username=options["user"])
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {options['user']!r}") from None
        batch_size = options["batch_size"]
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        events = read_messages(path)
        title = options["title"] if options["title"] is not None else path.stem

        progress = tqdm(
            total=len(events),
            unit="event",
            desc=f"import {path.name}",
            file=getattr(self.stderr, "_out", self.stderr),
            disable=options.get("verbosity", 1) == 0,
        )
        # The append's auto compaction starts when this transaction commits. A command's
        # in-memory broker dies with the command, so then the run happens here, before exit.
        inline = tasks_inline_unless_broker_outlives_process()
        try:
            with inline as runs_inline, transaction.atomic():
                session = services.session_create(
                    owner=owner,
                    model=options["model"],
                    title=title[:200],
                    context_limit=options["context_limit"],
                )
                for start in range(0, len(events), batch_size):
                    batch = events[start : start + batch_size]
                    try:
                        services.event_append(session=session, events=[event for _, event in batch])
                    except LedgerError as exc:
                        raise CommandError(
                            f"{path}, line {_line_of(exc, batch)}: {exc.detail}"
                        ) from None
                    progress.update(len(batch))
        except LedgerError as exc:
            raise CommandError(exc.detail) from None
        finally:
            progress.close()
        self.stderr.write(f"Imported {len(events)} events from {path} into session {session.pk}")
        compaction = Session.objects.get(pk=session.pk).last_compaction
        if runs_inline and compaction:
            self.stderr.write(
                f"Compaction ({compaction.get('trigger')}, {compaction.get('strategy')}) ran in "
                f"this process: {compaction.get('status')}, {compaction.get('tokensBefore')} → "
                f"{compaction.get('tokensAfter')} context tokens"
            )
        return str(session.pk)


def _line_of(exc: LedgerError, batch: list[tuple[int, EventInput]]) -> str:
    # Services name fields by position in the batch ("[3].content").
    for key in exc.extra.get("fields") or {}:
        if key.startswith("[") and "]" in key:
            try:
                return str(batch[int(key[1 : key.index("]")])][0])
            except (ValueError, IndexError):
                break
    return f"{batch[0][0]}-{batch[-1][0]}"
