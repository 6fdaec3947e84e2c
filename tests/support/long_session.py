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


def runs_after_idle_gap(owner, *, runs: int = 12, title: str = "") -> Session:
    """A session with `runs` summarize compactions, all of them after an idle day: its first
    turns are dated a day back and the runs come seconds apart, so on a time axis the runs
    stand almost on one x (the case whose drop labels once collapsed into one blob). The
    window is set so the largest context sits at the compact threshold, where auto
    compaction would have run: the drops start on the threshold line and its label."""
    from datetime import timedelta

    from compaction_app.models import RunStatus
    from sessions_app.models import Event

    session = summarized_session(owner, turns=runs + 2, title=title)
    day_ago = session.created_at - timedelta(days=1)
    Session.objects.filter(pk=session.pk).update(created_at=day_ago)
    first_run = (
        CompactionRun.objects.filter(session=session, status=RunStatus.COMPLETED)
        .order_by("created_at")
        .select_related("compaction_event")
        .first()
    )
    assert first_run is not None and first_run.compaction_event is not None
    for event in Event.objects.filter(session=session, seq__lt=first_run.compaction_event.seq):
        Event.objects.filter(pk=event.pk).update(created_at=event.created_at - timedelta(days=1))
    peak = max(
        CompactionRun.objects.filter(session=session).values_list("tokens_before", flat=True)
    )
    compact_at = session.settings.get("compactThreshold", 0.8)
    Session.objects.filter(pk=session.pk).update(context_limit=int(peak / compact_at))
    session.refresh_from_db()
    return session


def sixty_turns_with_runs_and_reverts(owner, *, title: str = "") -> Session:
    """60 turns, a summarize run after every fifth (a dozen), every third of them reverted
    right after it completed; the window set so the largest context sits between the compact
    threshold and the hard limit, where the drops, their labels, the threshold lines and the
    data line crowd each other."""
    from compaction_app.services import compaction_revert

    session = session_create(
        owner=owner,
        model="gpt-4o",
        title=title,
        context_limit=100_000,
        system_prompt="You are a careful coding agent.",
        settings={"autoCompact": False, "keepRecentEvents": 2},
    )
    for turn in range(60):
        event_append(
            session=session,
            events=[
                EventInput(type="USER_MESSAGE", content=f"Step {turn}: fix src/mod_{turn}.py."),
                EventInput(
                    type="AGENT_MESSAGE",
                    content=f"Fixed src/mod_{turn}.py: error E{turn} is gone. " * (3 + turn % 4),
                    token_usage=TokenUsage(900 + turn, 40, 940 + turn),
                ),
            ],
        )
        if turn % 5 == 4:
            session.refresh_from_db()
            run = compaction_request(
                session=session, user=None, strategy="summarize", enqueue=False
            )
            run = compaction_execute(run_id=run.pk)
            if (turn // 5) % 3 == 2:
                compaction_revert(run=run)
    peak = max(
        CompactionRun.objects.filter(session=session).values_list("tokens_before", flat=True)
    )
    # The peak at 88 % of the window: between the thresholds (80 %, 95 %).
    Session.objects.filter(pk=session.pk).update(context_limit=int(peak / 0.88))
    session.refresh_from_db()
    return session
