"""A per-thread fit in the Messages API's own shape (pure): the summary as a last system
block carrying its own cache breakpoint, at most four breakpoints in all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_app.gateway.shape import RESUME_TEXT, Plan, summary_text

# Anthropic accepts at most this many cache breakpoints in one request.
MAX_BREAKPOINTS = 4
SUMMARY_BREAKPOINT = {"type": "ephemeral"}


def render_fitted(
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
