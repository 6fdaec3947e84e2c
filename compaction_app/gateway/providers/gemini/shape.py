"""A fitted Gemini request (pure): a per-thread fit in the client's own shape
(`render_fitted`), and the ledger's Chat-shaped render as `contents` (`with_context`, the
fallback ladder).

Cache-stable as the other wires: `systemInstruction`, `tools` and every kept content go out
as the client sent them (the same objects, so the same bytes); the summary is one more part
at the end of `systemInstruction`, which moves only when a compaction runs; cleared function
responses carry their placeholder in `response.output`, with their name and id kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from compaction_app.gateway.shape import RESUME_TEXT, Plan, summary_text

# The ids the gateway gives calls (and their responses) the API sent without one.
SYNTHETIC_PREFIX = "gemini:"
SIGNATURE = "thoughtSignature"


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def field(mapping: dict[str, Any], name: str) -> Any:
    """A field in either spelling the API reads (camelCase, or the proto's snake_case)."""
    value = mapping.get(name)
    return mapping.get(_snake(name)) if value is None else value


def _key(mapping: dict[str, Any], name: str) -> str:
    """The spelling `mapping` uses for `name` (camelCase when it has neither)."""
    return _snake(name) if name not in mapping and _snake(name) in mapping else name


def call_ids(parts: Sequence[dict[str, Any]]) -> list[str]:
    """Each part's call id ("" for a part that is neither a function call nor a response):
    its own id, else its function's name and its rank among that function's id-less parts
    in this content (a response pairs with the call of the same name and rank)."""
    ids: list[str] = []
    seen: dict[str, int] = {}
    for part in parts:
        found = field(part, "functionCall") or field(part, "functionResponse")
        if not isinstance(found, dict):
            ids.append("")
            continue
        own = found.get("id")
        if isinstance(own, str) and own:
            ids.append(own)
            continue
        name = str(found.get("name"))
        rank = seen.get(name, 0)
        seen[name] = rank + 1
        ids.append(f"{SYNTHETIC_PREFIX}{name}:{rank}")
    return ids


def _parts(content: Any) -> list[Any]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return list(parts) if isinstance(parts, list) else []


def _with_summary(body: dict[str, Any], summary: str) -> dict[str, Any]:
    key = _key(body, "systemInstruction")
    system = body.get(key)
    part = {"text": summary_text(summary)}
    if isinstance(system, dict):
        return {**body, key: {**system, "parts": [*_parts(system), part]}}
    if isinstance(system, str) and system:
        return {**body, key: {"parts": [{"text": system}, part]}}
    return {**body, key: {"parts": [part]}}


def render_fitted(
    body: dict[str, Any], units: Sequence[dict[str, Any]], plan: Plan, model: str
) -> dict[str, Any]:
    fitted = _with_summary(body, plan.summary) if plan.summary is not None else dict(body)
    contents: list[Any] = []
    calls: set[str] = set()
    for index in plan.kept:
        unit = units[index]
        if unit.get("role") == "system":
            continue  # systemInstruction stays in the body as sent
        content = unit["content"]
        parts = _parts(content)
        ids = call_ids(parts)
        if unit.get("role") == "model":
            calls.update(i for i in ids if i)
            contents.append(content)
            continue
        cleared = plan.cleared.get(index) or {}
        kept: list[Any] = []
        for part, call_id in zip(parts, ids, strict=True):
            if call_id:
                if call_id not in calls:
                    continue  # its call was folded: a response without its call is refused
                text = cleared.get(call_id)
                if text is not None:
                    key = _key(part, "functionResponse")
                    part = {**part, key: {**part[key], "response": {"output": text}}}
            kept.append(part)
        if not kept:
            continue
        if len(kept) != len(parts) or cleared:
            content = {**content, "parts": kept}
        contents.append(content)
    if contents and isinstance(contents[0], dict) and contents[0].get("role") == "model":
        contents.insert(0, {"role": "user", "parts": [{"text": RESUME_TEXT}]})
    fitted["contents"] = contents
    return fitted


def _text_parts(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"text": content}]
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        # Recorded parts (the non-text rule): Gemini's own, or text parts of another wire.
        return [
            {"text": p["text"]} if p.get("type") == "text" and "text" in p else p for p in content
        ]
    return [{"text": json.dumps(content)}]


def with_context(
    body: dict[str, Any], *, messages: list[dict[str, Any]], system: str | None, model: str
) -> dict[str, Any]:
    """The body with the ledger's Chat-shaped render as `contents`: system messages (the
    client's instructions, then the summary) become `systemInstruction`, tool calls
    `functionCall` parts, tool messages `functionResponse` parts (named after their call)."""
    system_parts: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    signatures: dict[str, Any] = {}

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if not parts:
            return
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": list(parts)})

    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system_parts.extend(_text_parts(content))
        elif role == "assistant":
            parts = _text_parts(content)
            # The signatures recorded beside the calls (on stand-ins for them) go back on the
            # calls themselves (the render may give the calls a message of their own).
            signatures.update(
                (str(field(part, "functionCall").get("id")), field(part, SIGNATURE))
                for part in parts
                if isinstance(field(part, "functionCall"), dict)
            )
            parts = [part for part in parts if not isinstance(field(part, "functionCall"), dict)]
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                call_id = str(call.get("id") or "")
                names[call_id] = str(function.get("name", ""))
                try:
                    args = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    args = {"arguments": function.get("arguments")}
                found: dict[str, Any] = {"name": names[call_id], "args": args}
                if call_id and not call_id.startswith(SYNTHETIC_PREFIX):
                    found["id"] = call_id
                part: dict[str, Any] = {"functionCall": found}
                if signatures.get(call_id) is not None:
                    part[SIGNATURE] = signatures[call_id]
                parts.append(part)
            add("model", parts)
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            response: dict[str, Any] = {
                "name": names.get(call_id) or str(message.get("name") or ""),
                "response": {"output": content if isinstance(content, str) else content},
            }
            if call_id and not call_id.startswith(SYNTHETIC_PREFIX):
                response["id"] = call_id
            add("user", [{"functionResponse": response}])
        else:
            add("user", _text_parts(content))
    if contents and contents[0]["role"] == "model":
        contents.insert(0, {"role": "user", "parts": [{"text": RESUME_TEXT}]})
    fitted = {k: v for k, v in body.items() if k not in ("systemInstruction", "system_instruction")}
    if system_parts:
        fitted[_key(body, "systemInstruction")] = {"parts": system_parts}
    fitted["contents"] = contents
    return fitted
