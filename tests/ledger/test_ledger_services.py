"""The writes sessions_app does for compaction and the gateway (sessions_app/services.py):
folding, clearing and undoing them, the counters, threads and what a reply leaves."""

from __future__ import annotations

import pytest

from sessions_app.models import Event, EventType, Session, Thread
from sessions_app.services import (
    Clearing,
    EventInput,
    RowUpdate,
    compaction_undo,
    event_append,
    events_clear,
    events_fold,
    session_create,
    session_give_back_cumulative,
    session_note_reply,
    session_recount_active,
    session_take_cumulative,
    thread_get_or_create,
    thread_note_error,
    thread_remember,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(alice):
    return session_create(owner=alice, model="gpt-4o", settings={"autoCompact": False})


def test_it_folds_clears_and_undoes_a_compaction_with_the_counters_recounted(session):
    old, result, _ = event_append(
        session=session,
        events=[
            EventInput(type=EventType.USER_MESSAGE, content="look at the logs " * 20),
            EventInput(
                type=EventType.TOOL_RESULT, content="line\n" * 200, tool_call_id="c1", name="sh"
            ),
            EventInput(type=EventType.USER_MESSAGE, content="and now?"),
        ],
    ).events
    before = Session.objects.get(pk=session.pk)
    marker = event_append(
        session=session, events=[EventInput(type=EventType.COMPACTION, content="summary")]
    ).events[0]

    events_fold(event_ids=[old.pk], marker=marker)
    events_clear(
        clearings=[Clearing(event_id=str(result.pk), placeholder="[cleared]", token_count=4)],
        marker=marker,
    )
    folded = session_recount_active(session_id=session.pk)
    assert folded.active_event_count == before.active_event_count  # -1 folded, +1 summary
    assert folded.active_tokens < before.active_tokens
    result.refresh_from_db()
    assert result.cleared_content == "[cleared]" and result.cleared_by_id == marker.pk

    compaction_undo(session=session, marker_id=marker.pk, refresh=False)
    undone = session_recount_active(session_id=session.pk)
    assert undone.active_event_count == before.active_event_count
    assert undone.active_tokens == before.active_tokens
    assert Event.objects.get(pk=marker.pk).reverted
    assert Event.objects.get(pk=old.pk).compacted_by_id is None


def test_it_hands_the_cumulative_counter_to_one_taker_and_takes_it_back(session):
    Session.objects.filter(pk=session.pk).update(cumulative_tokens=500)
    assert session_take_cumulative(session_id=session.pk, threshold=400)
    assert not session_take_cumulative(session_id=session.pk, threshold=400)
    session_give_back_cumulative(session_id=session.pk, tokens=500)
    assert Session.objects.get(pk=session.pk).cumulative_tokens == 500


def test_it_creates_a_thread_once_and_remembers_and_notes_on_it(session):
    thread, created = thread_get_or_create(
        session=session, key="main", named=False, anchor_index=0, anchor_hash="h"
    )
    again, created_again = thread_get_or_create(
        session=session, key="main", named=False, anchor_index=0, anchor_hash="h"
    )
    assert created and not created_again and again.pk == thread.pk
    thread_remember(
        update=RowUpdate(model=Thread, pk=thread.pk, deltas={"calls": 2}, values={"length": 7})
    )
    thread_remember(
        update=RowUpdate(model=Thread, pk=thread.pk, deltas={"calls": 1}, values={"length": 9})
    )
    assert not thread_note_error(session=session, thread=None, text="x" * 900, main_key="main")
    thread.refresh_from_db()
    assert (thread.calls, thread.length, len(thread.last_error)) == (3, 9, 500)
    with pytest.raises(ValueError, match="Thread"):
        thread_remember(update=RowUpdate(model=Session, pk=session.pk, deltas={}, values={}))


def test_it_notes_a_new_main_thread_when_the_session_has_none(session):
    assert thread_note_error(session=session, thread=None, text="boom", main_key="main")
    assert Thread.objects.get(session=session).last_error == "boom"


def test_it_lets_a_reply_set_only_its_own_session_fields(session):
    session_note_reply(session_id=session.pk, updates={"last_serving_model": "gpt-4o-2024"})
    assert Session.objects.get(pk=session.pk).last_serving_model == "gpt-4o-2024"
    with pytest.raises(ValueError, match="context_limit"):
        session_note_reply(session_id=session.pk, updates={"context_limit": 1})
