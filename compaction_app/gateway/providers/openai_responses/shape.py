"""A per-thread fit in the Responses API's own shape (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_app.gateway.shape import Plan, summary_text

# The units parse_request builds (see the package).
TURN_UNIT = "__assistant_turn__"
INSTRUCTIONS_UNIT = "__instructions__"
_CALL_ITEMS = ("function_call", "custom_tool_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


def render_fitted(
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
