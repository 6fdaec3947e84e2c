"""The fitted request in the client's own shape (pure: no Django, no ORM).

Fitting never rebuilds a request from the ledger: it keeps the client's own messages and
drops the ones a compaction folded, puts the summary where the wire format keeps
instructions, and swaps cleared tool results for their placeholders. Whatever the client
put on a kept message (system blocks, `cache_control`, images, the text beside a tool call,
fields the gateway has no rule for) goes out as it came, in its place.

Everything here is a function of the request and the ledger's state (which units are
folded, the summary's text, the cleared placeholders): the same inputs give the same bytes,
so between two compactions each forwarded request is the previous one plus the new turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_app.gateway.responses import INSTRUCTIONS_UNIT, TURN_UNIT

# Rendered before the summary's text: fixed words, no counters or timestamps (the bytes of an
# unchanged prefix must not move).
SUMMARY_HEADER = "Summary of the earlier conversation (compacted by Context Ledger):\n"
# Anthropic's user turn opening a conversation whose first kept message is the assistant's.
RESUME_TEXT = "(The earlier conversation is summarized in the system prompt.)"
# Anthropic accepts at most this many cache breakpoints in one request.
MAX_BREAKPOINTS = 4
SUMMARY_BREAKPOINT = {"type": "ephemeral"}


@dataclass(frozen=True)
class Plan:
    """What to forward: the request's units by index (system units included), the summary
    standing for the folded ones (None: nothing folded), and cleared tool results
    (unit index → tool call id → placeholder text)."""

    kept: tuple[int, ...]
    summary: str | None
    cleared: Mapping[int, Mapping[str, str]]


def summary_text(summary: str) -> str:
    return SUMMARY_HEADER + summary


def render(
    wire: str, body: dict[str, Any], units: Sequence[dict[str, Any]], plan: Plan, model: str
) -> dict[str, Any]:
    if wire == "anthropic":
        return _anthropic(body, units, plan, model)
    if wire == "responses":
        return _responses(body, units, plan, model)
    return _openai(body, units, plan, model)


def _openai(
    body: dict[str, Any], units: Sequence[dict[str, Any]], plan: Plan, model: str
) -> dict[str, Any]:
    kept = set(plan.kept)
    leading = 0
    while leading < len(units) and units[leading].get("role") in ("system", "developer"):
        leading += 1
    out: list[dict[str, Any]] = [units[i] for i in range(leading) if i in kept]
    if plan.summary is not None:
        out.append({"role": "system", "content": summary_text(plan.summary)})
    calls: set[str] = set()
    rest = [i for i in plan.kept if i >= leading]
    for index in rest:
        message = units[index]
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict):
                    calls.add(str(call.get("id")))
        if role == "tool" and str(message.get("tool_call_id")) not in calls:
            continue  # its call was folded: a result without its call is refused
        cleared = plan.cleared.get(index)
        if cleared and role == "tool":
            text = cleared.get(str(message.get("tool_call_id")))
            if text is not None:
                message = {**message, "content": text}
        out.append(message)
    return {**body, "model": model, "messages": out}


_CALL_ITEMS = ("function_call", "custom_tool_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


def _responses(
    body: dict[str, Any], units: Sequence[dict[str, Any]], plan: Plan, model: str
) -> dict[str, Any]:
    """Responses input items: `instructions` stays in the body as sent; a model turn (a run of
    reasoning, message and call items) goes out whole while it is kept; an output whose call
    was folded is left out; the summary is a developer message after the leading ones."""
    kept = set(plan.kept)
    leading = 0
    while leading < len(units) and (
        units[leading].get("type") == INSTRUCTIONS_UNIT
        or units[leading].get("role") in ("system", "developer")
    ):
        leading += 1
    out: list[dict[str, Any]] = [
        units[i] for i in range(leading) if i in kept and units[i].get("type") != INSTRUCTIONS_UNIT
    ]
    if plan.summary is not None:
        out.append({"type": "message", "role": "developer", "content": summary_text(plan.summary)})
    calls: set[str] = set()
    for index in plan.kept:
        if index < leading:
            continue
        unit = units[index]
        if unit.get("type") == TURN_UNIT:
            for item in unit.get("items") or []:
                if isinstance(item, dict) and item.get("type") in _CALL_ITEMS:
                    calls.add(str(item.get("call_id")))
                out.append(item)
            continue
        if unit.get("type") in _OUTPUT_ITEMS:
            call_id = str(unit.get("call_id"))
            if call_id not in calls:
                continue  # its call was folded: an output without its call is refused
            text = (plan.cleared.get(index) or {}).get(call_id)
            if text is not None:
                unit = {**unit, "output": text}
        out.append(unit)
    return {**body, "model": model, "input": out}


def _anthropic(
    body: dict[str, Any], units: Sequence[dict[str, Any]], plan: Plan, model: str
) -> dict[str, Any]:
    has_system = bool(units) and units[0].get("role") == "system"
    offset = 1 if has_system else 0
    fitted: dict[str, Any] = {**body, "model": model}
    if plan.summary is not None:
        system = body.get("system")
        blocks: list[Any]
        if isinstance(system, list):
            blocks = list(system)
        elif system:
            blocks = [{"type": "text", "text": system}]
        else:
            blocks = []
        blocks.append(
            {
                "type": "text",
                "text": summary_text(plan.summary),
                "cache_control": dict(SUMMARY_BREAKPOINT),
            }
        )
        fitted["system"] = blocks
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for index in plan.kept:
        if index < offset:
            continue
        message = units[index]
        content = message.get("content")
        if isinstance(content, list):
            cleared = plan.cleared.get(index) or {}
            blocks = []
            for block in content:
                if not isinstance(block, dict):
                    blocks.append(block)
                    continue
                if block.get("type") == "tool_use":
                    calls.add(str(block.get("id")))
                if block.get("type") == "tool_result":
                    tool_id = str(block.get("tool_use_id"))
                    if tool_id not in calls:
                        continue  # its call was folded
                    if tool_id in cleared:
                        block = {**block, "content": cleared[tool_id]}
                blocks.append(block)
            if not blocks:
                continue
            if len(blocks) != len(content) or cleared:
                message = {**message, "content": blocks}
        if not messages and message.get("role") == "assistant":
            messages.append({"role": "user", "content": RESUME_TEXT})
        messages.append(message)
    fitted["messages"] = messages
    return cap_breakpoints(fitted)


def _marked(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every block carrying a `cache_control` marker, in the order the API reads them
    (tools, system, messages): the oldest first."""
    found: list[dict[str, Any]] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and "cache_control" in tool:
            found.append(tool)
    system = body.get("system")
    if isinstance(system, list):
        found.extend(b for b in system if isinstance(b, dict) and "cache_control" in b)
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            found.extend(b for b in content if isinstance(b, dict) and "cache_control" in b)
    return found


def cap_breakpoints(body: dict[str, Any]) -> dict[str, Any]:
    """At most MAX_BREAKPOINTS markers: the oldest extra ones are dropped (copies are made of
    what changes; the client's body is not touched)."""
    marked = _marked(body)
    extra = len(marked) - MAX_BREAKPOINTS
    if extra <= 0:
        return body
    drop = {id(block) for block in marked[:extra]}

    def strip(block: Any) -> Any:
        if isinstance(block, dict) and id(block) in drop:
            return {k: v for k, v in block.items() if k != "cache_control"}
        return block

    out = dict(body)
    if body.get("tools"):
        out["tools"] = [strip(tool) for tool in body["tools"]]
    if isinstance(body.get("system"), list):
        out["system"] = [strip(block) for block in body["system"]]
    messages = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(id(b) in drop for b in content):
            message = {**message, "content": [strip(b) for b in content]}
        messages.append(message)
    out["messages"] = messages
    return out
