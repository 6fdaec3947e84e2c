"""The OpenAI Chat Completions wire format (`Wire`, wire.py): request messages <-> ledger
events, replies, usage, streamed chunks and error bodies, and OpenAI's own routes. Pure: no
Django, no ORM."""

from __future__ import annotations

import json
from collections.abc import Mapping
from operator import itemgetter
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
    require_str,
    text_and_json,
)
from compaction_app.gateway.providers.openai_chat.cache import cache_rules as cache_rules
from compaction_app.gateway.providers.openai_chat.shape import render_fitted as render_fitted

NAME = "openai"
PREFIX = "openai/v1"
RENDER_FORMAT = "openai"
UPSTREAM_SETTING = "LEDGER_OPENAI_UPSTREAM"
KEY_QUERY = ""
KEY_HEADER = "authorization"
MESSAGES_PARAM = "messages"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# Chat Completions' own endpoint and OpenAI's model list; the Responses API shares the
# prefix (responses.py), and any other path under it passes through (views.py).
ROUTES: tuple[wire.Route, ...] = (
    wire.Route("chat/completions", wire.CONVERSATION, "openai-chat"),
    wire.Route("models", wire.MODELS, "openai-models", methods=("GET",)),
)


def complete_url(base: str, *, model: str, stream: bool, params: Mapping[str, str]) -> str:
    return base + "/chat/completions"


def usage(raw: Any) -> dict[str, Any]:
    """`prompt_tokens` includes `prompt_tokens_details.cached_tokens` (OpenAI caches prefixes
    itself and bills no writes). Streamed, this is the final chunk's usage, present when the
    client asked for `stream_options.include_usage`. `completion_tokens` includes
    `completion_tokens_details.reasoning_tokens` (an o-series or gpt-5 model's reasoning)."""
    details = raw if isinstance(raw, dict) else {}
    return usage_figures.fields(
        prompt=usage_figures.number(raw, "prompt_tokens"),
        completion=usage_figures.number(raw, "completion_tokens"),
        total=usage_figures.number(raw, "total_tokens"),
        cached=usage_figures.number(details.get("prompt_tokens_details"), "cached_tokens")
        if isinstance(raw, dict)
        else None,
        reasoning=usage_figures.number(
            details.get("completion_tokens_details"), "reasoning_tokens"
        ),
        dropped=_unreadable(details),
    )


def _unreadable(raw: dict[str, Any]) -> dict[str, str]:
    """Figures there but not whole numbers of tokens: named (read as absent, never as 0)."""
    return {
        **usage_figures.unreadable(raw, _FIGURES),
        **usage_figures.unreadable(
            raw.get("prompt_tokens_details"), {"cached_tokens": "cachedInputTokens"}
        ),
        **usage_figures.unreadable(
            raw.get("completion_tokens_details"), {"reasoning_tokens": "reasoningTokens"}
        ),
    }


_FIGURES = {
    "prompt_tokens": "promptTokens",
    "completion_tokens": "completionTokens",
    "total_tokens": "totalTokens",
}


def with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    return {**body, "model": model}


def count_tokens_body(count: int) -> dict[str, Any]:
    return {"input_tokens": count}


def parse_request(
    body: Any, params: Mapping[str, str] | None = None, *, checked: int = 0
) -> wire.ParsedRequest:
    """Validate the fields the gateway reads: (model, raw messages, stream). Everything else
    in the body passes through untouched."""
    if not isinstance(body, dict):
        raise GatewayInputError("the request body must be a JSON object")
    model = require_str(body.get("model"), "model", allow_empty=False)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayInputError("messages must be a non-empty array", param="messages")
    # A retry's body holds only checked messages: nothing left to check (an empty slice is
    # no failure: it sent a 1,600-message retry through the Python walk, issue 42).
    unchecked = messages[checked:] if checked else messages
    if unchecked and not _plainly_valid(unchecked):
        _refuse_messages(messages)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise GatewayInputError("stream must be a boolean", param="stream")
    return wire.ParsedRequest(model, list(messages), bool(stream))


_ROLE_SET = frozenset(ROLES)
_ROLE_OF = itemgetter("role")


def _plainly_valid(messages: list[Any]) -> bool:
    """Every message a JSON object with a known role, checked by C iterators (a Python step
    per message took 0.12 ms of a 1,600-message call); False when any is not, or when a role
    is not a hashable value: `_refuse_messages` then finds the first that fails."""
    if set(map(type, messages)) != {dict}:
        return False
    try:
        return set(map(_ROLE_OF, messages)) <= _ROLE_SET
    except (KeyError, TypeError):  # no role, or one that is a list or an object
        return False


def _refuse_messages(messages: list[Any]) -> None:
    """The first message that is not an object with a known role, refused."""
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise GatewayInputError("each message must be an object", param=f"messages[{index}]")
        if message.get("role") not in ROLES:
            raise GatewayInputError(
                f"role must be one of {', '.join(ROLES)}", param=f"messages[{index}].role"
            )


def _content(value: Any, param: str) -> tuple[str, Any]:
    if value is None:
        return "", ""
    if isinstance(value, str):
        return value, value
    if isinstance(value, list):
        return text_and_json(value, param)
    raise GatewayInputError("content must be a string, an array of parts or null", param=param)


def to_client_message(message: dict[str, Any], index: int = 0) -> ClientMessage:
    """One request message as the gateway identifies and records it."""
    where = f"messages[{index}]"
    role = message["role"]
    name = message.get("name") or ""
    if not isinstance(name, str):
        raise GatewayInputError("name must be a string", param=f"{where}.name")
    text, content = _content(message.get("content"), f"{where}.content")
    if role in ("system", "developer"):
        return ClientMessage(
            role="system",
            hash_text=text,
            tool_ids=(),
            drafts=(EventDraft(SYSTEM_PROMPT, content, name=name),),
        )
    if role == "user":
        return ClientMessage(
            role="user",
            hash_text=text,
            tool_ids=(),
            drafts=(EventDraft(USER_MESSAGE, content, name=name),),
        )
    if role in ("tool", "function"):
        call_id = message.get("tool_call_id") or ""
        if not isinstance(call_id, str) or (role == "tool" and not call_id):
            raise GatewayInputError(
                "tool_call_id must be a non-empty string", param=f"{where}.tool_call_id"
            )
        return ClientMessage(
            role="tool",
            hash_text=text,
            tool_ids=(call_id,),
            drafts=(EventDraft(TOOL_RESULT, content, name=name, tool_call_id=call_id),),
        )
    # assistant
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise GatewayInputError("tool_calls must be an array", param=f"{where}.tool_calls")
    drafts: list[EventDraft] = []
    if text or not calls:
        drafts.append(EventDraft(AGENT_MESSAGE, content, name=name))
    ids: list[str] = []
    for number, call in enumerate(calls):
        param = f"{where}.tool_calls[{number}]"
        if not isinstance(call, dict):
            raise GatewayInputError("each tool call must be an object", param=param)
        call_id = require_str(call.get("id"), f"{param}.id", allow_empty=False)
        function = call.get("function")
        if not isinstance(function, dict):
            raise GatewayInputError("function must be an object", param=f"{param}.function")
        function_name = require_str(function.get("name"), f"{param}.function.name")
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        ids.append(call_id)
        drafts.append(EventDraft(TOOL_CALL, arguments, name=function_name, tool_call_id=call_id))
    return ClientMessage(
        role="assistant", hash_text=text, tool_ids=tuple(ids), drafts=tuple(drafts)
    )


def with_context(
    body: dict[str, Any], *, messages: list[dict[str, Any]], system: str | None, model: str
) -> dict[str, Any]:
    """The body to forward, with the fitted messages in place of the client's."""
    return {**body, "model": model, "messages": messages}


def reply_from_response(payload: Any, *, model: str) -> Reply | None:
    """The assistant message and usage of a non-streamed response (None if it has none)."""
    if not isinstance(payload, dict):
        return None
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    try:
        client_message = to_client_message({**message, "role": "assistant"})
    except GatewayInputError:
        return None
    return wire.reply_of(client_message, payload, model=model, usage_fields=usage)


def _reply(message: ClientMessage, model: str, raw: dict[str, Any]) -> Reply:
    return Reply(message=message, model=model, raw_usage=raw, priced_apart=(), **usage(raw))


def error_body(
    message: str,
    *,
    status: int,
    code: str | None = None,
    param: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    # 429: the gateway's own is a spent budget, OpenAI's `insufficient_quota`.
    kind = {
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "insufficient_quota",
    }
    return {
        "error": {
            "message": message,
            "type": kind.get(status, "invalid_request_error" if status < 500 else "api_error"),
            "param": param,
            "code": code,
            **extra,
        }
    }


def stream_error(message: str) -> bytes:
    """An error relayed in the middle of a stream, as OpenAI sends one."""
    payload = {"error": {"message": message, "type": "api_error", "param": None, "code": None}}
    return f"data: {json.dumps(payload)}\n\n".encode()


def stream_accumulator(model: str) -> StreamAccumulator:
    return StreamAccumulator(model)


class StreamAccumulator(wire.SSEAccumulator):
    """Follows a chat.completion.chunk SSE stream and rebuilds the reply it carries."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] = {}

    def _data(self, data: bytes) -> None:
        data = data.strip()
        if data == b"[DONE]":
            self.done = True
            return
        payload = wire.sse_json(data)
        if payload is None:
            return
        if "error" in payload:
            self.errored = True
            return
        if payload.get("model"):
            self.model = str(payload["model"])
        if isinstance(payload.get("usage"), dict):
            self._usage = payload["usage"]
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                slot = self._calls.setdefault(
                    int(call.get("index", 0)), {"id": "", "name": "", "arguments": []}
                )
                function = call.get("function") or {}
                if call.get("id"):
                    slot["id"] = call["id"]
                if function.get("name"):
                    slot["name"] += function["name"]
                if function.get("arguments"):
                    slot["arguments"].append(function["arguments"])

    def reply(self) -> Reply | None:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
        calls = [
            {
                "id": slot["id"],
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
            }
            for _, slot in sorted(self._calls.items())
            if slot["id"]
        ]
        if calls:
            message["tool_calls"] = calls
        if not message["content"] and not calls:
            return None
        return _reply(to_client_message(message), self.model, self._usage)
