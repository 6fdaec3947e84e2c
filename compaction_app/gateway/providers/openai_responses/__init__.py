"""The OpenAI Responses wire format (`Wire`, wire.py): input items <-> ledger events, replies,
the typed event stream and error bodies, and the Responses API's own routes. Pure: no
Django, no ORM.

Units: `instructions` (when given) first, then the input: a string is one user message;
items are messages (any role), function calls and their outputs, custom tool calls
(Codex's apply_patch) and theirs, reasoning items (with `encrypted_content`), compaction
items and any item type the gateway has no rule for. Consecutive model-side items
(assistant messages, reasoning, tool calls, unknown items) form one unit, as they are one
reply: a reply's output items are resent by the client as exactly that run of items, so the
reply recorded at a position and the resent run share their identity. Reasoning items are
recorded but left out of that identity, as Anthropic's thinking blocks are.

`store: false` clients (Codex) resend everything: matched and fitted like chat.
`previous_response_id` (or `conversation`) clients send only what is new: recorded after what
the session holds, forwarded as sent (parse_request says `continues`).
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
)
from compaction_app.gateway.providers import openai_chat as chat
from compaction_app.gateway.providers.openai_chat.cache import cache_rules as cache_rules
from compaction_app.gateway.providers.openai_responses.shape import (
    INSTRUCTIONS_UNIT,
    TURN_UNIT,
)
from compaction_app.gateway.providers.openai_responses.shape import (
    render_fitted as render_fitted,
)

NAME = "responses"
PREFIX = "openai/v1"
RENDER_FORMAT = "openai"
UPSTREAM_SETTING = "LEDGER_OPENAI_UPSTREAM"
KEY_QUERY = ""
KEY_HEADER = "authorization"
MESSAGES_PARAM = "input"
ROUTES: tuple[wire.Route, ...] = (
    wire.Route("responses", wire.CONVERSATION, "openai-responses"),
    wire.Route("responses/compact", wire.PASSTHROUGH, "openai-responses-compact"),
    wire.Route("responses/input_tokens", wire.PASSTHROUGH, "openai-responses-input-tokens"),
    wire.Route(
        "responses/<str:response_id>",
        wire.PASSTHROUGH,
        "openai-responses-item",
        methods=("GET", "DELETE"),
    ),
)

# Content part types whose text is the message's text.
_TEXT_PARTS = ("input_text", "output_text", "text")
# Content part types of a message (anything else in a recorded list is an item of its own).
_PARTS = (*_TEXT_PARTS, "refusal", "input_image", "input_file", "input_audio", "summary_text")
_CALLS = ("function_call", "custom_tool_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_REASONING = ("reasoning",)
# The units a model turn and the instructions become (shape.py reads them too).
_TURN = TURN_UNIT
_INSTRUCTIONS = INSTRUCTIONS_UNIT


def complete_url(base: str, *, model: str, stream: bool, params: Mapping[str, str]) -> str:
    return base + "/responses"


def usage(raw: Any) -> dict[str, Any]:
    """`input_tokens` includes `input_tokens_details.cached_tokens`; `output_tokens`
    includes `output_tokens_details.reasoning_tokens`."""
    details = raw if isinstance(raw, dict) else {}
    return usage_figures.fields(
        prompt=usage_figures.number(raw, "input_tokens"),
        completion=usage_figures.number(raw, "output_tokens"),
        total=usage_figures.number(raw, "total_tokens"),
        cached=usage_figures.number(details.get("input_tokens_details"), "cached_tokens")
        if isinstance(raw, dict)
        else None,
        reasoning=usage_figures.number(details.get("output_tokens_details"), "reasoning_tokens"),
        dropped={
            **usage_figures.unreadable(
                details,
                {
                    "input_tokens": "promptTokens",
                    "output_tokens": "completionTokens",
                    "total_tokens": "totalTokens",
                },
            ),
            **usage_figures.unreadable(
                details.get("input_tokens_details"), {"cached_tokens": "cachedInputTokens"}
            ),
            **usage_figures.unreadable(
                details.get("output_tokens_details"), {"reasoning_tokens": "reasoningTokens"}
            ),
        },
    )


def with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    return chat.with_model(body, model)


def count_tokens_body(count: int) -> dict[str, Any]:
    return chat.count_tokens_body(count)


def _is_model_side(item: dict[str, Any]) -> bool:
    """Items the model produced (a reply's output), as opposed to the client's input."""
    kind = item.get("type")
    if kind == "message" or (kind is None and "role" in item):
        return item.get("role") == "assistant"
    # Tool outputs of every kind (function_call_output, computer_call_output, ...), approval
    # responses and references are the client's.
    return not (
        isinstance(kind, str)
        and (kind.endswith(("_output", "_response")) or kind == "item_reference")
    )


def parse_request(
    body: Any, params: Mapping[str, str] | None = None, *, checked: int = 0
) -> wire.ParsedRequest:
    """Validate the fields the gateway reads: model, input, instructions, stream."""
    if not isinstance(body, dict):
        raise GatewayInputError("the request body must be a JSON object")
    model = require_str(body.get("model"), "model", allow_empty=False)
    given = body.get("input")
    if isinstance(given, str):
        items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": given}]
    elif isinstance(given, list):
        items = given[:checked]
        for index, item in enumerate(given[checked:], start=checked):
            if not isinstance(item, dict):
                raise GatewayInputError(
                    "each input item must be an object", param=f"input[{index}]"
                )
            kind = item.get("type")
            if kind is None and not isinstance(item.get("role"), str):
                raise GatewayInputError(
                    "an input item needs a type (or a role for a message)",
                    param=f"input[{index}]",
                )
            if kind is not None and not isinstance(kind, str):
                raise GatewayInputError("type must be a string", param=f"input[{index}].type")
            items.append(item)
    elif given is None:
        items = []
    else:
        raise GatewayInputError("input must be a string or an array of items", param="input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str | list):
        raise GatewayInputError("instructions must be a string", param="instructions")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise GatewayInputError("stream must be a boolean", param="stream")
    units: list[dict[str, Any]] = []
    if instructions:
        units.append({"type": _INSTRUCTIONS, "content": instructions})
    for item in items:
        if _is_model_side(item):
            if units and units[-1].get("type") == _TURN:
                units[-1]["items"].append(item)
            else:
                units.append({"type": _TURN, "items": [item]})
        else:
            units.append(item)
    # The provider holds the conversation (a previous response, a conversation object) or the
    # prompt (a stored prompt template): the request carries only what is new, if anything.
    continues = bool(
        body.get("previous_response_id") or body.get("conversation") or body.get("prompt")
    )
    if not units and not continues:
        raise GatewayInputError("input must not be empty", param="input")
    return wire.ParsedRequest(model, units, bool(stream), continues)


def _content(value: Any, param: str) -> tuple[str, Any]:
    """(identifying text, content to store): the text when every part is text, else the
    parts as JSON (the non-text rule)."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        return value, value
    if not isinstance(value, list):
        raise GatewayInputError("content must be a string or an array of parts", param=param)
    texts: list[str] = []
    for index, part in enumerate(value):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise GatewayInputError(
                "each content part must be an object with a type", param=f"{param}[{index}]"
            )
        if part["type"] not in _TEXT_PARTS:
            return canonical_json(value), value
        texts.append(require_str(part.get("text"), f"{param}[{index}].text"))
    text = "\n".join(texts)
    return text, text


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def to_client_message(unit: dict[str, Any], index: int = 0) -> ClientMessage:
    where = f"input[{index}]"
    kind = unit.get("type")
    if kind == _INSTRUCTIONS:
        text, stored = _content(unit["content"], "instructions")
        return ClientMessage(
            role="system", hash_text=text, tool_ids=(), drafts=(EventDraft(SYSTEM_PROMPT, stored),)
        )
    if kind == _TURN:
        return _turn(unit["items"], where)
    if kind in _OUTPUTS:
        call_id = require_str(unit.get("call_id"), f"{where}.call_id", allow_empty=False)
        output = unit.get("output")
        text, stored = _content(output, f"{where}.output")
        return ClientMessage(
            role="tool",
            hash_text=text,
            tool_ids=(call_id,),
            drafts=(EventDraft(TOOL_RESULT, stored, tool_call_id=call_id),),
        )
    if kind in (None, "message"):
        role = require_str(unit.get("role"), f"{where}.role", allow_empty=False)
        text, stored = _content(unit.get("content"), f"{where}.content")
        if role in ("system", "developer"):
            return ClientMessage(
                role="system",
                hash_text=text,
                tool_ids=(),
                drafts=(EventDraft(SYSTEM_PROMPT, stored),),
            )
        return ClientMessage(
            role=role if role == "user" else f"user:{role}",
            hash_text=text,
            tool_ids=(),
            drafts=(EventDraft(USER_MESSAGE, stored),),
        )
    # A client-side item the gateway has no rule for: recorded as JSON, as the user's input.
    stored_item = [unit]
    return ClientMessage(
        role=f"item:{kind}",
        hash_text=canonical_json(_without_id(unit)),
        tool_ids=(),
        drafts=(EventDraft(USER_MESSAGE, stored_item),),
    )


def _without_id(item: dict[str, Any]) -> dict[str, Any]:
    # Item ids are the provider's bookkeeping; a client may resend an item without its id.
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def _turn(items: list[dict[str, Any]], where: str) -> ClientMessage:
    """A run of model-side items: AGENT_MESSAGE (the messages' text, or the items as JSON when
    any is not plain text) followed by one TOOL_CALL per call."""
    texts: list[str] = []
    others: list[Any] = []
    kept: list[dict[str, Any]] = []
    only_text = True
    calls: list[EventDraft] = []
    ids: list[str] = []
    for number, item in enumerate(items):
        param = f"{where}[{number}]"
        kind = item.get("type") or "message"
        if kind in _CALLS:
            call_id = require_str(item.get("call_id"), f"{param}.call_id", allow_empty=False)
            name = require_str(item.get("name"), f"{param}.name")
            body = item.get("arguments") if kind == "function_call" else item.get("input")
            ids.append(call_id)
            calls.append(
                EventDraft(TOOL_CALL, _arguments(body or ""), name=name, tool_call_id=call_id)
            )
            continue
        kept.append(item)
        if kind == "message":
            text, _ = _content(item.get("content"), f"{param}.content")
            if isinstance(item.get("content"), list) and any(
                isinstance(p, dict) and p.get("type") not in _TEXT_PARTS for p in item["content"]
            ):
                only_text = False
                others.append(_without_id(item))
            else:
                texts.append(text)
        else:
            only_text = False
            if kind not in _REASONING:
                others.append(_without_id(item))
    hash_text = "\n".join(texts)
    if others:
        hash_text += "\n" + canonical_json(others)
    drafts: list[EventDraft] = []
    if kept or not calls:
        own: Any = "\n".join(texts) if only_text else kept
        drafts.append(EventDraft(AGENT_MESSAGE, own))
    drafts.extend(calls)
    return ClientMessage(
        role="assistant", hash_text=hash_text, tool_ids=tuple(ids), drafts=tuple(drafts)
    )


def _output_message(content: Any) -> dict[str, Any]:
    if isinstance(content, str):
        parts: Any = [{"type": "output_text", "text": content, "annotations": []}]
    else:
        parts = content
    return {"type": "message", "role": "assistant", "content": parts}


def _assistant_items(content: Any) -> list[dict[str, Any]]:
    """A recorded assistant content back as output items: text becomes a message; a recorded
    list holds items (messages, reasoning, ...) or, from another wire, content parts."""
    if content is None or content == "":
        return []
    if not isinstance(content, list):
        return [_output_message(content if isinstance(content, str) else json.dumps(content))]
    items: list[dict[str, Any]] = []
    parts: list[Any] = []
    for element in content:
        if isinstance(element, dict) and element.get("type") not in _PARTS:
            if parts:
                items.append(_output_message(parts))
                parts = []
            items.append(element)
        else:
            parts.append(element)
    if parts:
        items.append(_output_message(parts))
    return items


def with_context(
    body: dict[str, Any], *, messages: list[dict[str, Any]], system: str | None, model: str
) -> dict[str, Any]:
    """The body to forward, with fitted Chat-shaped messages (the ledger's "openai" render)
    as input items. The first system prompt goes back into `instructions` when the client
    used it."""
    items: list[dict[str, Any]] = []
    instructions: list[str] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            # The client's instructions were recorded first: they go back where they were
            # (the same prefix, for the provider's cache); a summary stays in the input.
            if "instructions" in body and not instructions and isinstance(content, str):
                instructions.append(content)
            else:
                items.append({"type": "message", "role": role, "content": content})
        elif role == "assistant":
            items.extend(_assistant_items(content))
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id", ""),
                        "name": function.get("name", ""),
                        "arguments": function.get("arguments", ""),
                    }
                )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id", ""),
                    "output": content if isinstance(content, str | list) else json.dumps(content),
                }
            )
        elif isinstance(content, list) and len(content) == 1 and _is_item(content[0]):
            items.append(content[0])  # an input item recorded as it was sent
        else:
            items.append({"type": "message", "role": role or "user", "content": content})
    fitted = {**body, "model": model, "input": items}
    if instructions:
        fitted["instructions"] = "\n\n".join(instructions)
    else:
        fitted.pop("instructions", None)
    return fitted


def _is_item(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") not in (*_PARTS, None)


def reply_from_response(payload: Any, *, model: str) -> Reply | None:
    """The output items and usage of a response object (None without output)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("output"), list):
        return None
    items = [item for item in payload["output"] if isinstance(item, dict)]
    if not items:
        return None
    try:
        message = _turn(items, "output")
    except GatewayInputError:
        return None
    return wire.reply_of(message, payload, model=model, usage_fields=usage)


def error_body(
    message: str,
    *,
    status: int,
    code: str | None = None,
    param: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return chat.error_body(message, status=status, code=code, param=param, **extra)


def stream_error(message: str) -> bytes:
    """An error in the middle of a Responses stream, as the API sends one."""
    payload = {
        "type": "error",
        "code": "server_error",
        "message": message,
        "param": None,
        "sequence_number": 0,
    }
    return f"event: error\ndata: {json.dumps(payload)}\n\n".encode()


def stream_accumulator(model: str) -> StreamAccumulator:
    return StreamAccumulator(model)


class StreamAccumulator(wire.SSEAccumulator):
    """Follows a Responses event stream and rebuilds the reply: the final response object's
    output when `response.completed` (or `.incomplete`) arrives, else the items finished so
    far plus the text streamed into unfinished ones."""

    _CLOSING = ("response.completed", "response.incomplete")

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self._items: dict[int, dict[str, Any]] = {}
        self._partial: dict[int, list[str]] = {}
        self._final: dict[str, Any] | None = None

    def _data(self, data: bytes) -> None:
        payload = wire.sse_json(data)
        if payload is None:
            return
        kind = payload.get("type")
        response = payload.get("response")
        if isinstance(response, dict) and response.get("model"):
            self.model = str(response["model"])
        index = payload.get("output_index")
        if kind == "response.output_item.added" and isinstance(index, int):
            self._items.setdefault(index, dict(payload.get("item") or {}))
        elif kind == "response.output_item.done" and isinstance(index, int):
            self._items[index] = dict(payload.get("item") or {})
            self._partial.pop(index, None)
        elif kind == "response.output_text.delta" and isinstance(index, int):
            self._partial.setdefault(index, []).append(str(payload.get("delta", "")))
        elif kind in self._CLOSING and isinstance(response, dict):
            self._final = response
            self.done = True
        elif kind in ("response.failed", "error"):
            self.errored = True

    def reply(self) -> Reply | None:
        if self._final is not None and self._final.get("output"):
            return reply_from_response(self._final, model=self.model)
        items: list[dict[str, Any]] = []
        for index, item in sorted(self._items.items()):
            if index in self._partial and item.get("type") == "message":
                item = _output_message("".join(self._partial[index]))
            elif item.get("type") in _CALLS and item.get("status") == "in_progress":
                continue  # its arguments never finished
            items.append(item)
        usage = (self._final or {}).get("usage")
        return reply_from_response(
            {"output": items, "model": self.model, "usage": usage}, model=self.model
        )
