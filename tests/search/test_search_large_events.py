"""Search on SQLite never indexes a large backlog inside the request (issue 22, row 12).

SQLite has one writer: indexing a multi-MB event in one transaction held every other user's
appends for seconds. A search indexes at most one bounded batch, answers from what is indexed
and says so (`indexing`, `indexedThrough`); the background pass indexes the rest in batches
that each release the writer lock.
"""

from __future__ import annotations

import random
import string
import threading
import time

import pytest
from django.db import connection

from sessions_app import search_index
from tests.support.helpers import append_events, create_session

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's single writer lock"),
]

EVENT_MB = 8
# Generous for a loaded CI machine: an append normally takes a few milliseconds; the old
# whole-event indexing held the lock for as long as tokenizing all EVENT_MB took.
MAX_APPEND_STALL_SECONDS = 1.0
MAX_SEARCH_SECONDS = 2.0


def large_text(megabytes: int, *, first: str, last: str) -> str:
    rng = random.Random(22)
    vocabulary = [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(4000)
    ]
    words: list[str] = []
    size = 0
    while size < megabytes * 1_000_000:
        word = rng.choice(vocabulary)
        words.append(word)
        size += len(word) + 1
    return " ".join([first, *words, last])


class Appender(threading.Thread):
    """Another user appending small events, one after the other, timing each."""

    def __init__(self, api, session_id: str) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.session_id = session_id
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                append_events(
                    self.api,
                    session_id=self.session_id,
                    events=[{"type": "USER_MESSAGE", "content": "still here"}],
                )
                self.latencies.append(time.monotonic() - started)
                time.sleep(0.01)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connection.close()


def test_it_answers_a_search_on_a_large_unindexed_event_at_once_and_indexes_it_in_batches(
    alice_api, bob_api
):
    session_id = create_session(alice_api, limit=128_000)
    text = large_text(EVENT_MB, first="aardvarkfirst", last="zebracornlast")
    append_events(
        alice_api, session_id=session_id, events=[{"type": "USER_MESSAGE", "content": text}]
    )
    del text
    bob_session = create_session(bob_api)
    appender = Appender(bob_api, bob_session)
    appender.start()
    try:
        time.sleep(0.2)
        started = time.monotonic()
        response = alice_api.get(f"/api/v1/sessions/{session_id}/search", {"q": "zebracornlast"})
        elapsed = time.monotonic() - started
        assert response.status_code == 200, response.content
        body = response.json()
        assert elapsed < MAX_SEARCH_SECONDS, elapsed
        # The event's end is not indexed yet, and the answer says so.
        assert body["indexing"] is True
        assert body["indexedThrough"] == 1  # the system prompt
        assert body["results"] == []

        # The background pass (what the coalesced Celery task runs) indexes the rest, in
        # batches that let bob's appends through.
        worker = threading.Thread(target=_index_everything, daemon=True)
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive()
        time.sleep(0.2)
    finally:
        appender.stop.set()
        appender.join(timeout=30)
    assert not appender.errors, appender.errors
    assert len(appender.latencies) >= 5
    assert max(appender.latencies) < MAX_APPEND_STALL_SECONDS, sorted(appender.latencies)[-5:]

    body = alice_api.get(f"/api/v1/sessions/{session_id}/search", {"q": "zebracornlast"}).json()
    assert body["indexing"] is False and body["indexedThrough"] == 2
    assert [hit["seq"] for hit in body["results"]] == [2]
    first = alice_api.get(f"/api/v1/sessions/{session_id}/search", {"q": "aardvarkfirst"})
    assert [hit["seq"] for hit in first.json()["results"]] == [2]  # listed once


def _index_everything() -> None:
    try:
        search_index.search_index_everything()
    finally:
        connection.close()


def test_it_finds_a_phrase_cut_by_a_piece_boundary(alice_api):
    session_id = create_session(alice_api, limit=128_000)
    cut = search_index.CHUNK_CHARS
    # "needle_in_haystack" straddles the end of the first piece.
    text = "a " * ((cut - 8) // 2) + "needle_in_haystack " + "b " * 1000
    append_events(
        alice_api, session_id=session_id, events=[{"type": "USER_MESSAGE", "content": text}]
    )
    # Two pieces to index. The search's own bounded batch may index none, one or both (it
    # stops after BATCH_SECONDS, which a loaded machine reaches within the first piece): the
    # phrase is never found twice.
    body = alice_api.get(
        f"/api/v1/sessions/{session_id}/search", {"q": "NEEDLE_IN_HAYSTACK"}
    ).json()
    assert [hit["seq"] for hit in body["results"]] in ([], [2])
    # Once both pieces are indexed, their overlap finds it, once.
    search_index.search_index_everything()
    body = alice_api.get(
        f"/api/v1/sessions/{session_id}/search", {"q": "NEEDLE_IN_HAYSTACK"}
    ).json()
    assert body["indexing"] is False
    assert [hit["seq"] for hit in body["results"]] == [2]
