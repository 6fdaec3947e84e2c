"""Structural validators for provider message lists, written from the providers' documented
rules (not from the renderer), shared by the renderer's tests.

OpenAI Chat Completions:
* roles are system, developer, user, assistant, tool;
* an assistant message with `tool_calls` must be followed by one `tool` message for each
  `tool_call_id`, before any other message; a `tool` message must answer a call of that
  preceding assistant message ("messages with role 'tool' must be a response to a preceding
  message with 'tool_calls'");
* each tool call is `{id, type: "function", function: {name, arguments: string}}`;
* content is a string or an array of parts (an assistant message with tool calls may have
  null content); `name` must not contain whitespace or any of `<|\\/>`.

Anthropic Messages:
* `system` is a top-level parameter; messages have role user or assistant only, alternate,
  and the first is a user turn;
* content is a non-empty list of blocks; text blocks hold non-whitespace text;
* every `tool_use` block (id matching `^[a-zA-Z0-9_-]+$`, `input` an object) is answered by a
  `tool_result` block in the very next message, a user message, where tool results come
  before any other block; a `tool_result` answers a `tool_use` of the message right before;
* a final assistant message (a prefill) may not end in whitespace.
"""

from __future__ import annotations

import re
from typing import Any

_OPENAI_ROLES = {"system", "developer", "user", "assistant", "tool"}
_OPENAI_NAME = re.compile(r"^[^\s<|\\/>]+$")
_ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def _content_ok(content: Any) -> bool:
    return isinstance(content, str) or (
        isinstance(content, list) and all(isinstance(part, dict) for part in content)
    )


def check_openai(messages: list[dict[str, Any]]) -> None:
    pending: set[str] | None = None  # calls of the last assistant turn awaiting tool messages
    seen: set[str] = set()
    for index, message in enumerate(messages):
        where = f"message {index} {message!r:.200}"
        role = message.get("role")
        assert role in _OPENAI_ROLES, where
        if "name" in message:
            assert _OPENAI_NAME.match(message["name"]), where
        if role == "tool":
            assert pending, f"{where}: a tool message that answers no pending tool call"
            assert message.get("tool_call_id") in pending, where
            pending.discard(message["tool_call_id"])
            assert _content_ok(message.get("content")), where
            continue
        assert not pending, f"{where}: tool calls {pending} unanswered before this message"
        pending = None
        calls = message.get("tool_calls")
        if role == "assistant" and calls:
            ids = [call["id"] for call in calls]
            assert all(isinstance(i, str) and i for i in ids), where
            assert len(set(ids)) == len(ids) and not set(ids) & seen, f"{where}: repeated id"
            seen.update(ids)
            for call in calls:
                assert call["type"] == "function", where
                assert isinstance(call["function"]["name"], str) and call["function"]["name"]
                assert isinstance(call["function"]["arguments"], str), where
            assert message.get("content") is None or _content_ok(message["content"]), where
            pending = set(ids)
        else:
            assert "tool_calls" not in message, where
            assert _content_ok(message.get("content")), where
    assert not pending, f"tool calls {pending} unanswered at the end"


def check_anthropic(messages: list[dict[str, Any]], system: Any) -> None:
    assert system is None or isinstance(system, str)
    if not messages:
        return
    assert messages[0]["role"] == "user", "the first message must be a user turn"
    awaiting: set[str] = set()
    seen: set[str] = set()
    for index, message in enumerate(messages):
        where = f"message {index} {message!r:.300}"
        role = message["role"]
        assert role in ("user", "assistant"), where
        if index:
            assert role != messages[index - 1]["role"], f"{where}: roles must alternate"
        blocks = message["content"]
        assert isinstance(blocks, list) and blocks, where
        for block in blocks:
            assert block["type"] in ("text", "tool_use", "tool_result"), where
            if block["type"] == "text":
                assert isinstance(block["text"], str) and block["text"].strip(), where
        results = [b for b in blocks if b["type"] == "tool_result"]
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if role == "user":
            assert not uses, where
            assert all(b["type"] == "tool_result" for b in blocks[: len(results)]), (
                f"{where}: tool_result blocks must come first"
            )
            answered = [b["tool_use_id"] for b in results]
            assert len(set(answered)) == len(answered), where
            assert set(answered) == awaiting, f"{where}: answers {answered}, awaited {awaiting}"
            for block in results:
                content = block.get("content")
                assert content is None or isinstance(content, str | list), where
            awaiting = set()
        else:
            assert not results, where
            for use in uses:
                assert _ANTHROPIC_ID.match(use["id"]), where
                assert use["id"] not in seen, f"{where}: repeated tool_use id"
                seen.add(use["id"])
                assert isinstance(use["name"], str) and use["name"], where
                assert isinstance(use["input"], dict), where
            awaiting = {use["id"] for use in uses}
    assert not awaiting, f"tool_use {awaiting} unanswered at the end"
    last = messages[-1]
    if last["role"] == "assistant" and last["content"][-1]["type"] == "text":
        text = last["content"][-1]["text"]
        assert text == text.rstrip(), "a final assistant turn may not end in whitespace"
