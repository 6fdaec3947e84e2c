"""The one renderer of ledger events into provider message lists (pure: no ORM, no settings).

`/context`, `export_session` and the gateway all emit through here, so every list the service
hands out obeys the provider's structural rules, whatever the ledger holds:

* order: system prompts, then the summary (live COMPACTION events), then every other event by
  seq (`context_order`);
* a TOOL_RESULT is sent as a tool result only right after the assistant turn that holds its
  call (a result recorded later joins its call there); a result whose call is not in the list
  (never recorded, or folded / pruned away) becomes a user message saying so
  (`ORPHAN_RESULT_PREFIX`), and a second result for the same call likewise;
* a TOOL_CALL with no recorded result is answered by a synthesized result saying none was
  recorded (`MISSING_RESULT_TEXT`); a TOOL_CALL reusing an earlier call's id becomes assistant
  text;
* OpenAI: an assistant turn's `tool_calls` are followed directly by one `tool` message each;
* Anthropic: the system text is top-level, roles alternate (consecutive same-role turns merge
  their blocks), the first message is a user turn, each `tool_use` is answered by a
  `tool_result` block at the head of the next user message, text blocks are never empty, and
  `tool_use` ids match `^[A-Za-z0-9_-]+$`.

Every such repair is reported (`Rendered.repairs`) in OpenAI shape, so a caller can price it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sessions_app.event_types import EventType
from sessions_app.storable import load_stored

MISSING_RESULT_TEXT = "[no result was recorded for this tool call]"
ORPHAN_RESULT_PREFIX = "[tool result for call {call_id}{tool}, whose call is not in this context]"
DUPLICATE_RESULT_PREFIX = "[another tool result for call {call_id}{tool}, already answered above]"
DUPLICATE_CALL_PREFIX = "[tool call {call_id}{tool} reuses the id of an earlier call; not executed]"
# Anthropic wants the first message to be a user turn and text blocks to be non-empty.
LEADING_USER_TEXT = "[conversation continues]"
EMPTY_TEXT = "[empty message]"

_ANTHROPIC_ID = re.compile(r"^[A-Za-z0-9_-]+$")
# OpenAI refuses a `name` with whitespace or any of < | \ / >.
_OPENAI_NAME_BAD = re.compile(r"[\s<|\\/>]")


@dataclass(frozen=True)
class Record:
    """One ledger event as the renderer sees it. `content` is what should be sent: text, or
    structured parts (a list) / an object as the client stored them."""

    key: str
    type: str
    content: Any
    name: str = ""
    tool_call_id: str = ""


@dataclass(frozen=True)
class Repair:
    """A message the renderer made up or rewrote, in OpenAI shape; `replaces` is the key of
    the record it stands for (None for a synthesized one)."""

    kind: str  # orphan_result | duplicate_result | duplicate_call | missing_result | leading_user
    role: str
    content: str
    replaces: str | None = None
    call_id: str = ""


@dataclass
class Rendered:
    messages: list[dict[str, Any]]
    system: str | None = None
    repairs: list[Repair] = field(default_factory=list)


class _Typed(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def content(self) -> Any: ...


T = TypeVar("T", bound=_Typed)


def is_sent(item: _Typed) -> bool:
    """Whether an event is part of what the model sees: not a LOCAL_SYSTEM_MESSAGE, not a
    trim's empty COMPACTION marker."""
    if item.type == EventType.LOCAL_SYSTEM_MESSAGE:
        return False
    return not (item.type == EventType.COMPACTION and not item.content)


def context_order(items: Sequence[T]) -> list[T]:
    """The one send order: system prompts, the summary, then every other event (input order,
    which callers give by seq). Events the model never sees are dropped."""
    sent = [item for item in items if is_sent(item)]
    return (
        [item for item in sent if item.type == EventType.SYSTEM_PROMPT]
        + [item for item in sent if item.type == EventType.COMPACTION]
        + [
            item
            for item in sent
            if item.type not in (EventType.SYSTEM_PROMPT, EventType.COMPACTION)
        ]
    )


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


# --- the provider-neutral turn structure -------------------------------------------------------


@dataclass
class _Call:
    call_id: str
    name: str
    content: Any


@dataclass
class _Result:
    call_id: str
    content: Any
    name: str = ""


@dataclass
class _Turn:
    """One message: role system / user / assistant; an assistant turn may carry tool calls,
    then `results` answers each of them, in call order."""

    role: str
    content: Any = None
    name: str = ""
    summary: bool = False
    calls: list[_Call] = field(default_factory=list)
    results: list[_Result] = field(default_factory=list)


def _tool_label(name: str) -> str:
    return f" ({name})" if name else ""


def _turns(records: Sequence[Record]) -> tuple[list[_Turn], list[Repair]]:
    records = context_order(records)
    first_call: dict[str, int] = {}
    for index, record in enumerate(records):
        if record.type == EventType.TOOL_CALL and record.tool_call_id:
            first_call.setdefault(record.tool_call_id, index)
    # The result a call is answered with: the first one recorded after it.
    answer: dict[str, int] = {}
    for index, record in enumerate(records):
        call_at = first_call.get(record.tool_call_id)
        if record.type == EventType.TOOL_RESULT and call_at is not None and call_at < index:
            answer.setdefault(record.tool_call_id, index)

    turns: list[_Turn] = []
    repairs: list[Repair] = []
    open_turn: _Turn | None = None

    def close() -> None:
        nonlocal open_turn
        if open_turn is None:
            return
        for call in open_turn.calls:
            at = answer.get(call.call_id)
            if at is None:
                open_turn.results.append(_Result(call.call_id, MISSING_RESULT_TEXT))
                repairs.append(
                    Repair("missing_result", "tool", MISSING_RESULT_TEXT, call_id=call.call_id)
                )
            else:
                result = records[at]
                open_turn.results.append(_Result(call.call_id, result.content, result.name))
        open_turn = None

    for index, record in enumerate(records):
        kind = record.type
        if kind == EventType.TOOL_CALL and first_call.get(record.tool_call_id) == index:
            if open_turn is None:
                previous = turns[-1] if turns else None
                if (
                    previous is not None
                    and previous.role == "assistant"
                    and not previous.calls
                    and isinstance(previous.content, str)
                ):
                    # The assistant's words and the calls right after them are one turn.
                    open_turn = previous
                else:
                    open_turn = _Turn(role="assistant")
                    turns.append(open_turn)
            open_turn.calls.append(_Call(record.tool_call_id, record.name, record.content))
            continue
        close()
        if kind == EventType.TOOL_RESULT:
            if answer.get(record.tool_call_id) == index:
                continue  # already sent right after its call
            template = (
                DUPLICATE_RESULT_PREFIX if record.tool_call_id in answer else ORPHAN_RESULT_PREFIX
            )
            head = template.format(call_id=record.tool_call_id, tool=_tool_label(record.name))
            text = f"{head}\n{text_of(record.content)}"
            turns.append(_Turn(role="user", content=text))
            kind_name = "duplicate_result" if record.tool_call_id in answer else "orphan_result"
            repairs.append(Repair(kind_name, "user", text, replaces=record.key))
        elif kind == EventType.TOOL_CALL:
            head = DUPLICATE_CALL_PREFIX.format(
                call_id=record.tool_call_id, tool=_tool_label(record.name)
            )
            text = f"{head}\n{text_of(record.content)}"
            turns.append(_Turn(role="assistant", content=text))
            repairs.append(Repair("duplicate_call", "assistant", text, replaces=record.key))
        elif kind in (EventType.SYSTEM_PROMPT, EventType.COMPACTION):
            turns.append(
                _Turn(
                    role="system",
                    content=record.content,
                    name=record.name,
                    summary=kind == EventType.COMPACTION,
                )
            )
        elif kind == EventType.AGENT_MESSAGE:
            turns.append(_Turn(role="assistant", content=record.content, name=record.name))
        else:  # USER_MESSAGE, CONTEXT_REFRESH
            turns.append(_Turn(role="user", content=record.content, name=record.name))
    close()
    return turns, repairs


# --- OpenAI ------------------------------------------------------------------------------------


def _openai_content(content: Any) -> Any:
    # Text or a list of parts pass as they are; an object is not valid message content.
    return content if isinstance(content, str | list) else text_of(content)


def _openai_name(name: str) -> str:
    return _OPENAI_NAME_BAD.sub("_", name)[:64]


def to_openai(records: Sequence[Record], *, tool_result_names: bool = False) -> Rendered:
    """OpenAI Chat Completions messages. `tool_result_names` adds the tool's name to `tool`
    messages (the export's JSONL keeps it; the API does not take it)."""
    turns, repairs = _turns(records)
    messages: list[dict[str, Any]] = []
    for turn in turns:
        if turn.calls:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": _openai_content(turn.content) if turn.content is not None else None,
            }
            if turn.name:
                message["name"] = _openai_name(turn.name)
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": text_of(call.content)},
                }
                for call in turn.calls
            ]
            messages.append(message)
            for result in turn.results:
                tool: dict[str, Any] = {
                    "role": "tool",
                    "tool_call_id": result.call_id,
                    "content": _openai_content(result.content),
                }
                if tool_result_names and result.name:
                    tool["name"] = result.name
                messages.append(tool)
            continue
        message = {"role": turn.role, "content": _openai_content(turn.content)}
        if turn.name and not turn.summary:
            message["name"] = _openai_name(turn.name)
        messages.append(message)
    return Rendered(messages=messages, system=None, repairs=repairs)


# --- Anthropic ---------------------------------------------------------------------------------


def _anthropic_id(call_id: str) -> str:
    if _ANTHROPIC_ID.match(call_id):
        return call_id
    # Deterministic and collision-free: the cleaned id plus a digest of the original.
    digest = hashlib.sha1(call_id.encode(), usedforsecurity=False).hexdigest()[:10]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', call_id)}_{digest}"


def _text_block(content: Any) -> dict[str, Any]:
    text = text_of(content)
    return {"type": "text", "text": text if text.strip() else EMPTY_TEXT}


def _tool_input(content: Any) -> dict[str, Any]:
    if isinstance(content, dict):
        return content
    try:
        value = load_stored(content) if isinstance(content, str) else content
    except (ValueError, RecursionError):
        # Arguments are text to the ledger: anything that is not a JSON object (too long an
        # integer, nesting past the decoder's depth) is sent as text.
        return {"input": content}
    return value if isinstance(value, dict) else {"input": value}


def to_anthropic(records: Sequence[Record]) -> Rendered:
    """Anthropic Messages: (messages, top-level system text)."""
    turns, repairs = _turns(records)
    system_parts: list[str] = []
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})

    for turn in turns:
        if turn.role == "system":
            system_parts.append(text_of(turn.content))
            continue
        if not turn.calls:
            add(turn.role, [_text_block(turn.content)])
            continue
        blocks = [] if turn.content is None else [_text_block(turn.content)]
        blocks += [
            {
                "type": "tool_use",
                "id": _anthropic_id(call.call_id),
                "name": call.name,
                "input": _tool_input(call.content),
            }
            for call in turn.calls
        ]
        add("assistant", blocks)
        results = []
        for result in turn.results:
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": _anthropic_id(result.call_id),
            }
            text = text_of(result.content)
            if text:
                block["content"] = text
            results.append(block)
        # A new user message: the assistant turn just added ends with these calls, so the
        # results open the next message, ahead of any text merged after them.
        add("user", results)
    if messages and messages[-1]["role"] == "assistant":
        # A final assistant turn is a prefill, which may not end in whitespace.
        last = messages[-1]["content"][-1]
        if last["type"] == "text":
            last["text"] = last["text"].rstrip() or EMPTY_TEXT
    if messages and messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": [_text_block(LEADING_USER_TEXT)]})
        repairs.append(Repair("leading_user", "user", LEADING_USER_TEXT))
    return Rendered(messages=messages, system="\n\n".join(system_parts) or None, repairs=repairs)


def render(records: Sequence[Record], *, fmt: str = "openai") -> Rendered:
    """Render `records` (seq order) for `fmt` ("openai" or "anthropic")."""
    if fmt == "anthropic":
        return to_anthropic(records)
    return to_openai(records)
