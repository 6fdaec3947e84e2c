"""The Anthropic Messages wire format (`Wire`, wire.py): request messages <-> ledger events,
replies, streamed events and error bodies, and Anthropic's own routes. Pure: no Django, no
ORM.

The top-level `system` is the conversation's first message here (position 0), so positions
and hashes work the same as for OpenAI's inline system message.

A proxy first: roles other than user/assistant (Claude Code sends `{"role": "system"}` in
the middle of `messages` under a beta header) and block types the gateway has no rule for
(thinking with its signature, redacted thinking, server tools and their results, compaction
blocks, documents, images) are forwarded as sent and recorded as JSON (the non-text rule).
Thinking blocks are kept in the record but not in a message's identity: clients may drop
them from earlier turns when they resend the history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from compaction_app.gateway import usage as usage_figures
from compaction_app.gateway import wire
from compaction_app.gateway.messages import (
    AGENT_MESSAGE,
    SYSTEM_PROMPT,
    TOOL_CALL,
    TOOL_RESULT,
    USER_MESSAGE,
    ClientMessage,
    EventDraft,
    GatewayInputError,
    Reply,
    canonical_json,
    require_str,
    text_and_json,
)
from compaction_app.gateway.providers.anthropic_messages.cache import cache_rules as cache_rules
from compaction_app.gateway.providers.anthropic_messages.shape import render_fitted as render_fitted
from sessions_app.storable import provider_loads

NAME = "anthropic"
PREFIX = "anthropic"
RENDER_FORMAT = "anthropic"
UPSTREAM_SETTING = "LEDGER_ANTHROPIC_UPSTREAM"
KEY_QUERY = ""
KEY_HEADER = "x-api-key"
MESSAGES_PARAM = "messages"
ROUTES: tuple[wire.Route, ...] = (
    wire.Route("v1/messages", wire.CONVERSATION, "anthropic-messages"),
    wire.Route("v1/messages/count_tokens", wire.COUNT_TOKENS, "anthropic-count-tokens"),
)
ROLES = ("user", "assistant")
# Blocks that are the provider's own reasoning: recorded, never part of a message's hash.
_REASONING = ("thinking", "redacted_thinking")


def complete_url(base: str, *, model: str, stream: bool, params: Mapping[str, str]) -> str:
    return base + "/v1/messages"


def usage(raw: Any) -> dict[str, Any]:
    """`input_tokens` counts only what came after the last cache breakpoint, so the prompt is
    input + cache writes + cache reads. The write's 5-minute / 1-hour split is in
    `cache_creation` when the API gives it; the thinking part of the output in
    `output_tokens_details.thinking_tokens`.

    Server-side compaction (the `compact_20260112` edit) samples twice in one request: its
    `compaction` entries in `usage.iterations` are billed, and are not in the top-level
    figures (the API says so of them), so they are added here. `message` entries are the
    top-level figures' own parts and are not added again."""
    if not isinstance(raw, dict) or not raw:
        return usage_figures.fields(prompt=None, completion=None, total=None)
    prompt, completion, read, write, write_1h, dropped = _figures(raw)
    details = raw.get("output_tokens_details")
    reasoning = usage_figures.number(details, "thinking_tokens")
    dropped.update(usage_figures.unreadable(details, {"thinking_tokens": "reasoningTokens"}))
    iterations = raw.get("iterations")
    if isinstance(iterations, list):
        for entry in iterations:
            if not isinstance(entry, dict) or entry.get("type") != "compaction":
                continue
            more = _figures(entry)
            # An unreadable figure in an iteration makes the whole's figure unknown too.
            prompt = _both(prompt, more[0])
            completion = _both(completion, more[1])
            read = _plus(read, more[2])
            write = _plus(write, more[3])
            write_1h = _plus(write_1h, more[4])
            for name, why in more[5].items():
                dropped.setdefault(name, f"iterations: {why}")
    # Reasoning above the output it is part of is dropped and named by the one bound
    # (sessions_app/usage_bounds.py), not clamped.
    return usage_figures.fields(
        prompt=prompt,
        completion=completion,
        total=_both(prompt, completion),
        cached=read,
        write=write,
        write_1h=min(write_1h, write) if write_1h is not None and write is not None else None,
        reasoning=reasoning,
        dropped=dropped,
    )


def usage_parts(raw: Any) -> tuple[dict[str, int | None], ...]:
    """The compaction iterations `usage` adds (see `usage`), each as its own figures: the
    provider samples them as requests of their own, so each is priced alone."""
    iterations = raw.get("iterations") if isinstance(raw, dict) else None
    if not isinstance(iterations, list):
        return ()
    parts = []
    for entry in iterations:
        if isinstance(entry, dict) and entry.get("type") == "compaction":
            prompt, completion, read, write, write_1h, _ = _figures(entry)
            parts.append(
                usage_figures.fields(
                    prompt=prompt,
                    completion=completion,
                    total=_both(prompt, completion),
                    cached=read,
                    write=write,
                    write_1h=write_1h,
                )
            )
    return tuple(parts)


def _plus(total: int | None, more: int | None) -> int | None:
    return total if more is None else (total or 0) + more


def _both(one: int | None, other: int | None) -> int | None:
    """A sum whose every term must be known (an unreadable term makes it unknown)."""
    return None if one is None or other is None else one + other


def _figures(
    raw: dict[str, Any],
) -> tuple[int | None, int | None, int | None, int | None, int | None, dict[str, str]]:
    """(prompt, completion, cache reads, cache writes, one-hour writes, unreadable figures by
    API name) of one usage object: an unreadable figure is None, never 0."""
    number = usage_figures.number
    read = number(raw, "cache_read_input_tokens")
    write = number(raw, "cache_creation_input_tokens")
    creation = raw.get("cache_creation")
    write_1h = number(creation, "ephemeral_1h_input_tokens")
    if write is None and isinstance(creation, dict):
        parts = [number(creation, key) for key in creation]
        write = sum(part for part in parts if part is not None) or None
    # A part that is there but unreadable (negative, a fraction, `1e400`) makes the prompt
    # unknown, not smaller: it used to count as 0 (issue 42, row 4).
    dropped = usage_figures.unreadable(raw, _INPUT_PARTS)
    prompt: int | None = None
    if not dropped:
        prompt = (number(raw, "input_tokens") or 0) + (write or 0) + (read or 0)
    else:
        dropped = {"promptTokens": "; ".join(dropped.values())}
    dropped.update(usage_figures.unreadable(raw, {"output_tokens": "completionTokens"}))
    completion = number(raw, "output_tokens")
    if completion is None and "completionTokens" not in dropped:
        completion = 0
    return prompt, completion, read, write, write_1h, dropped


# The parts of Anthropic's prompt (input_tokens counts only what follows the last breakpoint).
_INPUT_PARTS = {
    "input_tokens": "promptTokens",
    "cache_read_input_tokens": "promptTokens",
    "cache_creation_input_tokens": "promptTokens",
}


def with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    return {**body, "model": model}


def count_tokens_body(count: int) -> dict[str, Any]:
    return {"input_tokens": count}


def parse_request(
    body: Any, params: Mapping[str, str] | None = None, *, checked: int = 0
) -> wire.ParsedRequest:
    """Validate the fields the gateway reads: (model, units, stream), where the units are the
    system prompt (when given) followed by the messages."""
    if not isinstance(body, dict):
        raise GatewayInputError("the request body must be a JSON object")
    model = require_str(body.get("model"), "model", allow_empty=False)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayInputError("messages: must be a non-empty array", param="messages")
    for index, message in enumerate(messages[checked:], start=checked):
        if not isinstance(message, dict):
            raise GatewayInputError(f"messages.{index}: must be an object", param="messages")
        role = message.get("role")
        # A system message may follow the first turn (Claude Code sends one there under the
        # `mid-conversation-system-*` beta); the conversation itself opens with a turn.
        if role not in ROLES and not (role == "system" and index > 0):
            raise GatewayInputError(
                f"messages.{index}.role: must be 'user' or 'assistant'"
                + (" (or 'system' after the first message)" if index == 0 else ""),
                param="messages",
            )
        if not isinstance(message.get("content"), str | list):
            raise GatewayInputError(
                f"messages.{index}.content: must be a string or an array of blocks",
                param="messages",
            )
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise GatewayInputError("system: must be a string or an array of text blocks")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise GatewayInputError("stream: must be a boolean")
    return wire.ParsedRequest(model, client_messages(body), bool(stream))


def client_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    units: list[dict[str, Any]] = []
    if body.get("system"):
        units.append({"role": "system", "content": body["system"]})
    units.extend(body["messages"])
    return units


def _block_text(content: Any, param: str) -> tuple[str, Any]:
    if isinstance(content, str):
        return content, content
    if isinstance(content, list):
        return text_and_json(content, param)
    if content is None:
        return "", ""
    raise GatewayInputError(f"{param}: must be a string or an array of blocks")


def to_client_message(unit: dict[str, Any], index: int = 0) -> ClientMessage:
    where = f"messages.{index}"
    role = unit["role"]
    content = unit.get("content")
    if role == "system":
        text, stored = _block_text(content, "system")
        return ClientMessage(
            role="system", hash_text=text, tool_ids=(), drafts=(EventDraft(SYSTEM_PROMPT, stored),)
        )
    own_kind = AGENT_MESSAGE if role == "assistant" else USER_MESSAGE
    if isinstance(content, str):
        kind = own_kind
        return ClientMessage(
            role=role, hash_text=content, tool_ids=(), drafts=(EventDraft(kind, content),)
        )
    blocks: list[Any] = content if isinstance(content, list) else []
    drafts: list[EventDraft] = []
    ids: list[str] = []
    texts: list[str] = []
    others: list[Any] = []
    for number, block in enumerate(blocks):
        param = f"{where}.content.{number}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise GatewayInputError(f"{param}: must be an object with a type")
        kind = block["type"]
        if kind == "text":
            texts.append(require_str(block.get("text"), f"{param}.text"))
        elif kind == "tool_result" and role == "user":
            tool_id = require_str(
                block.get("tool_use_id"), f"{param}.tool_use_id", allow_empty=False
            )
            text, stored = _block_text(block.get("content"), f"{param}.content")
            ids.append(tool_id)
            texts.append(text)
            drafts.append(EventDraft(TOOL_RESULT, stored, tool_call_id=tool_id))
        elif kind == "tool_use" and role == "assistant":
            tool_id = require_str(block.get("id"), f"{param}.id", allow_empty=False)
            name = require_str(block.get("name"), f"{param}.name")
            ids.append(tool_id)
            drafts.append(
                EventDraft(
                    TOOL_CALL, json.dumps(block.get("input") or {}), name=name, tool_call_id=tool_id
                )
            )
        elif kind in _REASONING:
            continue  # recorded with the message's own blocks, left out of its identity
        else:
            others.append(block)
    # The message's own blocks (text, thinking, images, documents, server tools) become one
    # USER / AGENT event: its text when it is all text (counted exactly), else the blocks as
    # JSON (the non-text rule).
    plain = [b for b in blocks if b["type"] not in ("tool_result", "tool_use")]
    kind = own_kind
    if plain or not drafts:
        non_text = [b for b in plain if b["type"] != "text"]
        own: Any = plain if non_text else "\n".join(b["text"] for b in plain)
        if others:
            texts.append(canonical_json(others))
        # Tool results come first in a user turn; an assistant's words precede its calls.
        drafts.insert(0 if role == "assistant" else len(drafts), EventDraft(kind, own))
    return ClientMessage(
        role=role, hash_text="\n".join(texts), tool_ids=tuple(ids), drafts=tuple(drafts)
    )


def with_context(
    body: dict[str, Any], *, messages: list[dict[str, Any]], system: str | None, model: str
) -> dict[str, Any]:
    fitted = {**body, "model": model, "messages": messages}
    if system:
        fitted["system"] = system
    else:
        fitted.pop("system", None)
    return fitted


def reply_from_response(payload: Any, *, model: str) -> Reply | None:
    if not isinstance(payload, dict) or not isinstance(payload.get("content"), list):
        return None
    try:
        message = to_client_message({"role": "assistant", "content": payload["content"]})
    except GatewayInputError:
        return None
    return wire.reply_of(message, payload, model=model, usage_fields=usage, usage_parts=usage_parts)


_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def error_body(
    message: str,
    *,
    status: int,
    code: str | None = None,
    param: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    error: dict[str, Any] = {"type": kind, "message": message, **extra}
    if code:
        error["code"] = code
    return {"type": "error", "error": error}


def stream_error(message: str) -> bytes:
    payload = {"type": "error", "error": {"type": "api_error", "message": message}}
    return f"event: error\ndata: {json.dumps(payload)}\n\n".encode()


# content_block_delta types that append to one string field of their block: (field, key).
_DELTA_FIELDS = {
    "text_delta": ("text", "text"),
    "thinking_delta": ("thinking", "thinking"),
    "signature_delta": ("signature", "signature"),
}


def stream_accumulator(model: str) -> StreamAccumulator:
    return StreamAccumulator(model)


class StreamAccumulator(wire.SSEAccumulator):
    """Follows a Messages SSE stream and rebuilds the reply it carries, every content block
    as the non-streamed reply would have it."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self._blocks: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] = {}

    def _data(self, data: bytes) -> None:
        payload = wire.sse_json(data)
        if payload is None:
            return
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message") or {}
            self.model = str(message.get("model") or self.model)
            self._usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            block = dict(payload.get("content_block") or {})
            if "input" in block and block.get("type") in ("tool_use", "server_tool_use"):
                block["_json"] = []
            self._blocks[int(payload.get("index", 0))] = block
        elif kind == "content_block_delta":
            target = self._blocks.get(int(payload.get("index", 0)))
            delta = payload.get("delta") or {}
            if target is None:
                return
            # Each delta type extends one field of its block; a type without a rule here is
            # left out of the record (the client still received it as sent).
            field = _DELTA_FIELDS.get(str(delta.get("type")))
            if field is not None:
                name, key = field
                target[name] = target.get(name, "") + str(delta.get(key, ""))
            elif delta.get("type") == "input_json_delta":
                target.setdefault("_json", []).append(str(delta.get("partial_json", "")))
            elif delta.get("type") == "citations_delta" and isinstance(delta.get("citation"), dict):
                target.setdefault("citations", []).append(delta["citation"])
        elif kind == "message_delta":
            self._usage.update(
                {k: v for k, v in (payload.get("usage") or {}).items() if v is not None}
            )
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.errored = True

    def reply(self) -> Reply | None:
        blocks: list[dict[str, Any]] = []
        for _, started in sorted(self._blocks.items()):
            block = {k: v for k, v in started.items() if k != "_json"}
            if "_json" in started:
                raw = "".join(started["_json"])
                try:
                    block["input"] = provider_loads(raw) if raw else started.get("input") or {}
                except ValueError:
                    block["input"] = {"partial_json": raw}
            blocks.append(block)
        if not blocks:
            return None
        return reply_from_response(
            {"content": blocks, "model": self.model, "usage": self._usage}, model=self.model
        )
