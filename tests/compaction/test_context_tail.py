"""A pruned view of a long session reads only the tail it can keep (`active_tail_heads`): the
heads it keeps are exactly those a prune of every head keeps, whatever the budget, with
parallel tool calls whose results interleave across the tail's edge, the last user message far
back, the system prompt and a summary."""

from __future__ import annotations

import pytest

from compaction_app.fitting import _items, fit_context, prune
from compaction_app.services import compaction_execute, compaction_request
from sessions_app.selectors import active_heads, active_tail_heads
from sessions_app.services import EventInput, event_append, session_create

pytestmark = pytest.mark.django_db


def _agent_run(owner):  # type: ignore[no-untyped-def]
    session = session_create(
        owner=owner,
        model="gpt-4o",
        title="tail",
        context_limit=1_000_000,
        system_prompt="You are a careful coding agent.",
        settings={"autoCompact": False, "keepRecentEvents": 2},
    )
    events = [EventInput(type="USER_MESSAGE", content="Fix every failing module, one by one.")]
    for step in range(60):
        a, b = f"call-{step}-a", f"call-{step}-b"
        size = 1 + step % 7
        events += [
            EventInput(type="AGENT_MESSAGE", content=f"Step {step}: checking two modules."),
            # Two parallel calls: their results come back interleaved, the second first.
            EventInput(type="TOOL_CALL", name="bash", tool_call_id=a, content=f'{{"n": {step}}}'),
            EventInput(type="TOOL_CALL", name="bash", tool_call_id=b, content=f'{{"m": {step}}}'),
            EventInput(
                type="TOOL_RESULT", name="bash", tool_call_id=b, content="ok line\n" * size * 9
            ),
            EventInput(
                type="TOOL_RESULT", name="bash", tool_call_id=a, content="1 failed\n" * size * 5
            ),
        ]
    event_append(session=session, events=events)
    return session


def test_it_keeps_the_same_heads_from_the_tail_as_from_every_head(alice) -> None:
    session = _agent_run(alice)
    every = active_heads(session=session)
    total = sum(h.cost for h in every)
    checked = 0
    for budget in range(40, total + 400, 37):
        tail = active_tail_heads(session=session, covering=budget)
        full = prune(_items(every), budget=budget)
        if tail is None:
            # The tail would be the whole context: the caller reads every head.
            assert budget >= total - 400
            continue
        assert len(tail) <= len(every)
        assert prune(_items(tail), budget=budget) == full, budget
        checked += 1
    assert checked > 50


def test_it_keeps_the_same_heads_after_a_summary(alice) -> None:
    session = _agent_run(alice)
    run = compaction_request(session=session, user=None, strategy="summarize", enqueue=False)
    compaction_execute(run_id=run.pk)
    every = active_heads(session=session)
    assert any(h.type == "COMPACTION" for h in every)
    for budget in range(60, sum(h.cost for h in every), 23):
        tail = active_tail_heads(session=session, covering=budget)
        if tail is not None:
            assert prune(_items(tail), budget=budget) == prune(_items(every), budget=budget)


def test_it_answers_a_capped_context_as_the_whole_read_would(alice) -> None:
    session = _agent_run(alice)
    every = active_heads(session=session)
    for cap in (300, 900, 2_500):
        fitted = fit_context(session=session, user=alice, max_tokens=cap)
        kept = prune(_items(every), budget=int(cap * 0.8)) or prune(_items(every), budget=cap)
        assert kept is not None
        # What was sent: the same events a prune of every head keeps, costed the same.
        sent = {h.seq for h in every if h.seq in set(kept)}
        assert fitted.pruned
        assert fitted.token_count == sum(h.cost for h in every if h.seq in sent) + 3
        assert len(fitted.messages) + (1 if fitted.system else 0) >= 1
