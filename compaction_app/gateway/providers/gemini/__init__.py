"""Google's Gemini API wire format (`Wire`, wire.py): `models/{model}:generateContent`,
`:streamGenerateContent?alt=sse` and `:countTokens`, on `v1beta` and `v1`. Pure: no Django,
no ORM.

The model and the action are in the path (the route's parameters), not in the body. Units:
`systemInstruction` (when given) first, then each entry of `contents` (role `user`, the
default, or `model`). A proxy first: a body keeps every field the gateway has no rule for,
in either spelling the API accepts (the proto JSON mapping reads `systemInstruction` and
`system_instruction` alike); parts are forwarded as sent, `thoughtSignature`,
`functionCall.id` and `functionResponse.id` included.

What identifies a content (its hash): its text, its calls' and responses' ids; never the
model's thoughts (`thought: true` parts) nor the signatures, which a client may drop when it
resends its history (as Anthropic's thinking blocks are left out). A call without an id (the
API does not always give one) is named after its function and its rank among that
function's calls in its content, and its response, in the next content, by the same rule.

A request naming `cachedContent` leans on a prefix Google keeps: recorded, forwarded as sent
(`unfitted`). The key arrives as `x-goog-api-key`, `?key=` or a bearer token: forwarded
upstream in its header, never stored (views._upstream_headers moves `?key=` there).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

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
)
from compaction_app.gateway.providers.gemini.cache import cache_rules as cache_rules
from compaction_app.gateway.providers.gemini.shape import (
    SIGNATURE,
    call_ids,
    field,
)
from compaction_app.gateway.providers.gemini.shape import (
    render_fitted as render_fitted,
)
from compaction_app.gateway.providers.gemini.shape import (
    with_context as with_context,
)

NAME = "gemini"
PREFIX = "gemini"
# The ledger's fallback render (fit.py's ladder) is Chat-shaped; with_context makes contents.
RENDER_FORMAT = "openai"
UPSTREAM_SETTING = "LEDGER_GEMINI_UPSTREAM"
KEY_QUERY = "key"
KEY_HEADER = "x-goog-api-key"
MESSAGES_PARAM = "contents"
# google-genai defaults to v1beta (the CLI's version); `http_options={"api_version": "v1"}`
# and newer SDKs send v1.
VERSIONS = ("v1beta", "v1")
GENERATE = "generateContent"
STREAM = "streamGenerateContent"
ROUTES: tuple[wire.Route, ...] = tuple(
    route
    for version in VERSIONS
    for route in (
        wire.Route(
            f"{version}/models/<str:model>:{GENERATE}",
            wire.CONVERSATION,
            f"gemini-{version}-generate",
            params=(("version", version), ("action", GENERATE)),
        ),
        wire.Route(
            f"{version}/models/<str:model>:{STREAM}",
            wire.CONVERSATION,
            f"gemini-{version}-stream",
            params=(("version", version), ("action", STREAM)),
        ),
        wire.Route(
            f"{version}/models/<str:model>:countTokens",
            wire.COUNT_TOKENS,
            f"gemini-{version}-count-tokens",
            params=(("version", version),),
        ),
    )
)
ROLES = ("user", "model")
# Roles older clients gave function responses; read as the user's.
_USER_SIDE = ("user", "function", "tool")


def complete_url(base: str, *, model: str, stream: bool, params: Mapping[str, str]) -> str:
    """`{base}/{version}/models/{model}:generateContent`, or the streamed action with the
    `alt` the client asked for: `sse` (Server-Sent Events, every SDK) or none (the API then
    streams one JSON array, relayed as it comes and recorded as a plain reply)."""
    version = params.get("version") or VERSIONS[0]
    name = quote(model.removeprefix("models/"), safe="")
    if not stream:
        return f"{base}/{version}/models/{name}:{GENERATE}"
    # As the client asked: SSE (every SDK), or one JSON array of chunks (`alt` left out).
    alt = params.get("alt")
    query = "?" + urlencode({"alt": alt}) if alt else ""
    return f"{base}/{version}/models/{name}:{STREAM}{query}"


def parse_request(
    body: Any, params: Mapping[str, str] | None = None, *, checked: int = 0
) -> wire.ParsedRequest:
    """Validate the fields the gateway reads: the model (from the path), `contents`,
    `systemInstruction`, `cachedContent`. A countTokens body may wrap a whole request in
    `generateContentRequest`."""
    params = params or {}
    if not isinstance(body, dict):
        raise GatewayInputError("the request body must be a JSON object")
    inner = field(body, "generateContentRequest")
    if isinstance(inner, dict) and "action" not in params:
        body = inner
    model = str(params.get("model") or "").removeprefix("models/")
    if not model.strip():
        raise GatewayInputError("the model must be named in the path", param="model")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise GatewayInputError("contents must be a non-empty array", param="contents")
    units: list[dict[str, Any]] = []
    system = field(body, "systemInstruction")
    if system is not None:
        _check_content(system, "systemInstruction", system=True)
        if _parts(system):
            units.append({"role": "system", "content": system})
    # `checked` counts top-level contents only: a countTokens body's wrapped request is
    # never one the gateway kept.
    checked = checked if inner is None else 0
    for index, content in enumerate(contents):
        role = (content.get("role") or "user") if index < checked else _checked(content, index)
        units.append({"role": "model" if role == "model" else "user", "content": content})
    cached = field(body, "cachedContent")
    return wire.ParsedRequest(
        model,
        units,
        params.get("action") == STREAM,
        unfitted=bool(cached),
    )


def _checked(content: Any, index: int) -> Any:
    """A content entry's role, once the entry is checked."""
    where = f"contents[{index}]"
    _check_content(content, where)
    role = content.get("role") or "user"
    if role not in (*ROLES, *_USER_SIDE):
        raise GatewayInputError("role must be 'user' or 'model'", param=f"{where}.role")
    return role


def _check_content(content: Any, where: str, *, system: bool = False) -> None:
    if system and isinstance(content, str):
        return
    if not isinstance(content, dict):
        raise GatewayInputError("each content must be an object", param=where)
    parts = content.get("parts")
    if not isinstance(parts, list) or not (parts or system):
        raise GatewayInputError("parts must be a non-empty array", param=f"{where}.parts")
    for number, part in enumerate(parts):
        if not isinstance(part, dict):
            raise GatewayInputError("each part must be an object", param=f"{where}.parts[{number}]")
        text = part.get("text")
        if text is not None and not isinstance(text, str):
            raise GatewayInputError("text must be a string", param=f"{where}.parts[{number}].text")
        for name in ("functionCall", "functionResponse"):
            value = field(part, name)
            if value is not None and not (
                isinstance(value, dict) and isinstance(value.get("name"), str)
            ):
                raise GatewayInputError(
                    f"{name} must be an object with a name",
                    param=f"{where}.parts[{number}].{name}",
                )


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    parts = content.get("parts") if isinstance(content, dict) else None
    return [part for part in parts or [] if isinstance(part, dict)]


def _is_plain_text(part: dict[str, Any]) -> bool:
    """A text part with nothing else the record would lose (no thought, no signature)."""
    return isinstance(part.get("text"), str) and set(part) <= {"text"}


def _response_text(response: Any) -> str:
    """A function's response as the ledger counts and shows it: the one string a response
    object holds (`{"output": "..."}`, Gemini CLI's shape), else the object as JSON."""
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    if isinstance(response, str):
        return response
    return json.dumps(response, ensure_ascii=False)


def _without_signature(part: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in part.items() if k not in ("thoughtSignature", "thought_signature")}


def to_client_message(unit: dict[str, Any], index: int = 0) -> ClientMessage:
    role = unit["role"]
    parts = _parts(unit["content"])
    if role == "system":
        return ClientMessage(
            role="system",
            hash_text=_joined_text(parts, "\n"),
            tool_ids=(),
            drafts=(EventDraft(SYSTEM_PROMPT, _stored(parts, "\n")),),
        )
    ids = call_ids(parts)
    if role == "model":
        return _model_message(parts, ids)
    drafts: list[EventDraft] = []
    texts: list[str] = []
    own: list[dict[str, Any]] = []
    for number, part in enumerate(parts):
        response = field(part, "functionResponse")
        if isinstance(response, dict):
            text = _response_text(response.get("response"))
            texts.append(text)
            drafts.append(
                EventDraft(
                    TOOL_RESULT, text, name=str(response.get("name")), tool_call_id=ids[number]
                )
            )
        else:
            own.append(part)
    if own or not drafts:
        texts.append(_joined_text(own, "\n"))
        # Tool results first in a user turn (as the Messages wire records them).
        drafts.append(EventDraft(USER_MESSAGE, _stored(own, "\n")))
    return ClientMessage(
        role="user",
        hash_text="\n".join(texts),
        tool_ids=tuple(i for i in ids if i),
        drafts=tuple(drafts),
    )


def _joined_text(parts: list[dict[str, Any]], sep: str) -> str:
    texts = [part["text"] for part in parts if isinstance(part.get("text"), str)]
    others = [
        _without_signature(part)
        for part in parts
        if not isinstance(part.get("text"), str) and not part.get("thought")
    ]
    text = sep.join(texts)
    return text + ("\n" + canonical_json(others) if others else "")


def _stored(parts: list[dict[str, Any]], sep: str) -> Any:
    """What the ledger keeps of a content's own parts: their text when all are plain text
    (counted exactly), else the parts themselves (the non-text rule)."""
    if all(_is_plain_text(part) for part in parts):
        return sep.join(part["text"] for part in parts)
    return parts


def _model_message(parts: list[dict[str, Any]], ids: list[str]) -> ClientMessage:
    """The model's turn: its words (thoughts and signatures recorded, never identifying it)
    then one TOOL_CALL per function call. A signed call's signature is kept with the words,
    on a stand-in for the call (its id and name, no arguments: those are the TOOL_CALL's), so
    the ledger's own render can send it back. Streamed text arrives in pieces the client may
    or may not join when it resends them, so the texts are joined without a separator."""
    calls: list[EventDraft] = []
    own: list[dict[str, Any]] = []
    signed: list[dict[str, Any]] = []
    for number, part in enumerate(parts):
        call = field(part, "functionCall")
        if isinstance(call, dict):
            signature = field(part, "thoughtSignature")
            if signature is not None:
                signed.append(
                    {
                        "functionCall": {"id": ids[number], "name": str(call.get("name"))},
                        SIGNATURE: signature,
                    }
                )
            calls.append(
                EventDraft(
                    TOOL_CALL,
                    json.dumps(call.get("args") or {}, ensure_ascii=False),
                    name=str(call.get("name")),
                    tool_call_id=ids[number],
                )
            )
        else:
            own.append(part)
    shown = [part for part in own if not part.get("thought")]
    drafts: list[EventDraft] = []
    if own or signed or not calls:
        if not signed and all(_is_plain_text(part) for part in own):
            stored: Any = "".join(part["text"] for part in own)
        else:
            stored = own + signed
        drafts.append(EventDraft(AGENT_MESSAGE, stored))
    drafts.extend(calls)
    return ClientMessage(
        role="assistant",
        hash_text=_joined_text(shown, ""),
        tool_ids=tuple(i for i in ids if i),
        drafts=tuple(drafts),
    )


def usage(raw: Any) -> dict[str, Any]:
    """`usageMetadata`: `promptTokenCount` is the whole prompt, `cachedContentTokenCount`
    (served from the cache) included, `toolUsePromptTokenCount` beside it; the model's output
    is `candidatesTokenCount` plus `thoughtsTokenCount` (thinking is billed as output, and
    reported apart from it: the reasoning tokens)."""
    number = usage_figures.number
    if not isinstance(raw, dict) or not raw:
        return usage_figures.fields(prompt=None, completion=None, total=None)
    # A figure that is there but unreadable (negative, a fraction, `1e400`) is named, and makes
    # the sum it is a part of unknown, not smaller (issue 42, row 4).
    dropped = usage_figures.unreadable(raw, _FIGURES)
    prompt = number(raw, "promptTokenCount")
    # The tool-use prompt (what the model read back from its own tool calls) is reported
    # beside the prompt and billed as input.
    tool_use = number(raw, "toolUsePromptTokenCount")
    if tool_use:
        prompt = (prompt or 0) + tool_use
    if "promptTokens" in dropped:
        prompt = None
    candidates = number(raw, "candidatesTokenCount")
    thoughts = number(raw, "thoughtsTokenCount")
    completion = (
        None if candidates is None and thoughts is None else (candidates or 0) + (thoughts or 0)
    )
    if "completionTokens" in dropped:
        completion = None
    total = number(raw, "totalTokenCount")
    if total is None and prompt is not None and "totalTokens" not in dropped:
        total = prompt + (completion or 0)
    return usage_figures.fields(
        prompt=prompt,
        completion=completion,
        total=total,
        cached=number(raw, "cachedContentTokenCount"),
        reasoning=thoughts,
        dropped=dropped,
    )


# usageMetadata's figures, by the API name of the neutral figure each is (a part of).
_FIGURES = {
    "promptTokenCount": "promptTokens",
    "toolUsePromptTokenCount": "promptTokens",
    "candidatesTokenCount": "completionTokens",
    "thoughtsTokenCount": "completionTokens",
    "totalTokenCount": "totalTokens",
    "cachedContentTokenCount": "cachedInputTokens",
}


def with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The model is named in the URL (complete_url): the body stays as it came."""
    return body


def count_tokens_body(count: int) -> dict[str, Any]:
    return {"totalTokens": count}


def reply_from_response(payload: Any, *, model: str) -> Reply | None:
    """The first candidate's content and the usage of a GenerateContentResponse (None when
    it has no content: a prompt blocked before any candidate)."""
    if isinstance(payload, list):
        # A stream without `alt=sse`: one JSON array of chunks, read as the SSE chunks are.
        accumulator = StreamAccumulator(model)
        for chunk in payload:
            if isinstance(chunk, dict):
                accumulator.add_chunk(chunk)
        return accumulator.reply()
    if not isinstance(payload, dict):
        return None
    candidates = payload.get("candidates")
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
        return None
    content = candidates[0].get("content")
    if not isinstance(content, dict) or not _parts(content):
        return None
    try:
        message = to_client_message({"role": "model", "content": content})
    except (GatewayInputError, KeyError, TypeError):
        return None
    raw = payload.get("usageMetadata")
    raw = raw if isinstance(raw, dict) else {}
    return Reply(
        message=message,
        model=str(payload.get("modelVersion") or model),
        raw_usage=raw,
        priced_apart=(),
        **usage(raw),
    )


# Google's canonical status names (google.rpc.Code) for the HTTP statuses the gateway answers.
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(
    message: str,
    *,
    status: int,
    code: str | None = None,
    param: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Google's error shape, `{"error": {"code", "message", "status"}}`; the gateway's own
    error code and figures ride in an ErrorInfo detail, as Google's own errors carry theirs."""
    name = _STATUS.get(status, "FAILED_PRECONDITION" if status < 500 else "INTERNAL")
    metadata = {key: str(value) for key, value in extra.items() if value is not None}
    if param:
        metadata["param"] = param
    error: dict[str, Any] = {"code": status, "message": message, "status": name}
    if code or metadata:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": code or name,
                "domain": "context-ledger",
                "metadata": metadata,
            }
        ]
    return {"error": error}


def stream_error(message: str) -> bytes:
    """An error in the middle of a stream, as one more `data:` chunk."""
    payload = {"error": {"code": 500, "message": message, "status": "INTERNAL"}}
    return f"data: {json.dumps(payload)}\n\n".encode()


def stream_accumulator(model: str) -> StreamAccumulator:
    return StreamAccumulator(model)


class StreamAccumulator(wire.SSEAccumulator):
    """Follows a `streamGenerateContent?alt=sse` stream (one GenerateContentResponse per
    `data:` chunk, no `[DONE]`) and rebuilds the reply: text pieces joined, every other part
    (function calls, signatures) as it came. The stream is complete once a candidate names
    its `finishReason`."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self._parts: list[dict[str, Any]] = []
        self._usage: dict[str, Any] = {}

    def _data(self, data: bytes) -> None:
        payload = wire.sse_json(data)
        if payload is not None:
            self.add_chunk(payload)

    def add_chunk(self, payload: dict[str, Any]) -> None:
        if "error" in payload:
            self.errored = True
            return
        if payload.get("modelVersion"):
            self.model = str(payload["modelVersion"])
        if isinstance(payload.get("usageMetadata"), dict):
            self._usage = payload["usageMetadata"]
        candidates = payload.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            return
        candidate = candidates[0]
        if not isinstance(candidate, dict):
            return
        content = candidate.get("content")
        for part in _parts(content):
            self._add(part)
        if candidate.get("finishReason"):
            self.done = True

    def _add(self, part: dict[str, Any]) -> None:
        last = self._parts[-1] if self._parts else None
        if (
            last is not None
            and set(part) <= {"text", "thought"}
            and isinstance(part.get("text"), str)
            and isinstance(last.get("text"), str)
            and bool(last.get("thought")) == bool(part.get("thought"))
            and set(last) <= {"text", "thought"}
        ):
            last["text"] += part["text"]
            return
        self._parts.append(dict(part))

    def reply(self) -> Reply | None:
        if not self._parts:
            return None
        return reply_from_response(
            {
                "candidates": [{"content": {"role": "model", "parts": self._parts}}],
                "modelVersion": self.model,
                "usageMetadata": self._usage,
            },
            model=self.model,
        )
