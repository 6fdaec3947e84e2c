"""A long summarized session built through the real services, for the session page's tests:
`turns` user/agent turns with a summarize compaction after each one past the first few, the
shape that once rendered one "3 events folded…" row per turn."""

from __future__ import annotations

from compaction_app.models import CompactionRun
from compaction_app.services import compaction_execute, compaction_request
from sessions_app.models import Session
from sessions_app.services import EventInput, TokenUsage, event_append, session_create


def summarized_session(owner, *, turns: int = 60, title: str = "") -> Session:
    session = session_create(
        owner=owner,
        model="gpt-4o",
        title=title,
        context_limit=100_000,
        system_prompt="You are a careful coding agent.",
        settings={"autoCompact": False, "keepRecentEvents": 2},
    )
    for turn in range(turns):
        event_append(
            session=session,
            events=[
                EventInput(type="USER_MESSAGE", content=f"Step {turn}: fix src/mod_{turn}.py."),
                EventInput(
                    type="TOOL_CALL",
                    name="run_tests",
                    tool_call_id=f"call-{turn}",
                    content=f'{{"path": "tests/test_mod_{turn}.py"}}',
                ),
                EventInput(
                    type="TOOL_RESULT",
                    name="run_tests",
                    tool_call_id=f"call-{turn}",
                    content=f"tests/test_mod_{turn}.py: 1 failed (E{turn}), 11 passed",
                ),
                EventInput(
                    type="AGENT_MESSAGE",
                    content=f"Fixed src/mod_{turn}.py: error E{turn} is gone, tests pass.",
                    token_usage=TokenUsage(900 + turn, 40, 940 + turn),
                ),
            ],
        )
        if turn >= 2:
            session.refresh_from_db()
            run = compaction_request(
                session=session, user=None, strategy="summarize", enqueue=False
            )
            compaction_execute(run_id=run.pk)
    session.refresh_from_db()
    return session


def completed_runs(session: Session) -> int:
    return CompactionRun.objects.filter(session=session, status="completed").count()
