"""A per-thread fit in Chat Completions' own shape (pure): the client's kept messages as
sent, the summary as a system message after the leading ones, cleared tool results as their
placeholders, a tool message whose call was folded left out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_app.gateway.shape import Plan, summary_text


def render_fitted(
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
