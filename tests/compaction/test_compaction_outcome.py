"""A run's JSON says what it did: "compacted", or "nothing_to_fold" with the reason (not only
the page), and the COMPACTION_COMPLETE message carries the same outcome."""

from __future__ import annotations

import pytest

from compaction_app.realtime.messages import compaction_complete
from compaction_app.services import compaction_execute, compaction_request
from sessions_app.services import EventInput, event_append, session_create

pytestmark = pytest.mark.django_db


def test_it_says_nothing_to_fold_in_the_runs_json(alice, alice_api):
    session = session_create(owner=alice, model="gpt-4o")
    event_append(session=session, events=[EventInput(type="USER_MESSAGE", content="hi")])
    run = compaction_request(session=session, user=None, strategy="summarize", enqueue=False)
    run = compaction_execute(run_id=run.pk)
    body = alice_api.get(f"/api/v1/compactions/{run.pk}").json()
    assert body["status"] == "completed"
    assert body["outcome"] == "nothing_to_fold" and body["foldedCount"] == 0
    assert "unchanged" in body["reason"]
    message = compaction_complete(run).to_json()
    assert message["outcome"] == "nothing_to_fold"
    # Not announced as a success: what happened and why.
    assert message["message"].startswith("Nothing to fold: ")
    assert "no event may be folded now" in message["message"]
    assert message["reason"] == body["reason"]


def test_it_says_compacted_when_events_were_folded(alice, alice_api):
    session = session_create(owner=alice, model="gpt-4o", settings={"autoCompact": False})
    event_append(
        session=session,
        events=[
            EventInput(type=kind, content=f"turn {index}: src/app_{index}.py " * 20)
            for index in range(8)
            for kind in ("USER_MESSAGE", "AGENT_MESSAGE")
        ],
    )
    run = compaction_request(session=session, user=None, strategy="summarize", enqueue=False)
    run = compaction_execute(run_id=run.pk)
    body = alice_api.get(f"/api/v1/sessions/{session.pk}/compactions").json()
    (listed,) = body["results"] if isinstance(body, dict) else body
    assert listed["outcome"] == "compacted" and listed["reason"] is None
    assert listed["foldedCount"] == run.folded_count > 0
