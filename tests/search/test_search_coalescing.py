"""Search indexing after appends: one queued pass covers every append of its window, in any
session, and leaves nothing unindexed."""

from __future__ import annotations

import threading

import pytest
from celery.signals import task_postrun

from sessions_app import receivers
from sessions_app.models import EventType
from sessions_app.services import EventInput, event_append, session_create
from tests.search.test_search import _unindexed
from tests.support.gateway_live import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def passes():
    runs: list[int] = []
    lock = threading.Lock()

    def ran(sender=None, retval=None, **kwargs):
        if getattr(sender, "name", "") == "sessions_app.search_index_everything":
            with lock:
                runs.append(retval)

    task_postrun.connect(ran, weak=False)
    yield runs
    task_postrun.disconnect(ran)


def test_it_indexes_the_appends_of_one_window_in_one_pass(alice, worker, passes, monkeypatch):
    monkeypatch.setattr(receivers, "INDEX_DELAY_SECONDS", 1.0)
    sessions = [
        session_create(owner=alice, model="gpt-4o", settings={"autoCompact": False})
        for _ in range(3)
    ]
    for number, session in enumerate(sessions):
        for turn in range(2):
            event_append(
                session=session,
                events=[EventInput(type=EventType.USER_MESSAGE, content=f"needle_{number}_{turn}")],
            )
    wait_until(lambda: passes, timeout=15)
    # Six appends in three sessions, one pass, every event indexed by it. (On a loaded machine
    # the last append may land after the window closed and queue a pass of its own: it finds
    # nothing left to index.)
    assert passes[0] == 6
    assert not any(passes[1:])
    assert all(_unindexed(str(session.pk)) == 0 for session in sessions)


def test_it_queues_again_once_the_window_closed(alice, worker, passes, monkeypatch):
    monkeypatch.setattr(receivers, "INDEX_DELAY_SECONDS", 1.0)
    session = session_create(owner=alice, model="gpt-4o", settings={"autoCompact": False})
    event_append(session=session, events=[EventInput(type=EventType.USER_MESSAGE, content="a")])
    wait_until(lambda: passes, timeout=15)
    event_append(session=session, events=[EventInput(type=EventType.USER_MESSAGE, content="b")])
    wait_until(lambda: len(passes) == 2, timeout=15)
    assert passes == [1, 1]
    assert _unindexed(str(session.pk)) == 0
