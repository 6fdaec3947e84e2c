"""Concurrent writers on one session: seq stays 1..N and the counters equal the stored sums.

These run against real transactions (the SQLite file in WAL mode with IMMEDIATE transactions,
or PostgreSQL with the session row lock), one database connection per thread.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db.models import Count, Sum

from sessions_app import services
from sessions_app.errors import Conflict
from sessions_app.models import MODEL_INVISIBLE_TYPES, Event, EventType, Session
from sessions_app.services import EventInput, TokenUsage
from tests.support.helpers import run_threads

THREADS = 8
PER_THREAD = 25

pytestmark = pytest.mark.django_db(transaction=True)


def make_session(**kwargs) -> Session:
    owner = get_user_model().objects.create_user(username=f"writer-{uuid.uuid4().hex[:8]}")
    return services.session_create(
        owner=owner,
        model="gpt-4o",
        system_prompt="system",
        settings={"autoCompact": False},
        **kwargs,
    )


def event(thread: int, index: int) -> EventInput:
    kind = [EventType.USER_MESSAGE, EventType.AGENT_MESSAGE, EventType.LOCAL_SYSTEM_MESSAGE][
        index % 3
    ]
    usage = (
        TokenUsage(prompt_tokens=index, completion_tokens=thread, total_tokens=index + thread)
        if kind == EventType.AGENT_MESSAGE
        else None
    )
    return EventInput(
        type=kind,
        content=f"thread {thread} event {index} " + "word " * (index % 7),
        token_usage=usage,
    )


def assert_ledger_consistent(session_id) -> None:
    session = Session.objects.get(pk=session_id)
    seqs = list(
        Event.objects.filter(session_id=session_id).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1))
    events = Event.objects.filter(session_id=session_id)
    visible = events.exclude(type__in=MODEL_INVISIBLE_TYPES)
    reported = events.filter(total_tokens__isnull=False)
    assert session.last_seq == len(seqs)
    assert session.event_count == len(seqs)
    assert session.ledger_tokens == events.aggregate(s=Sum("token_count"))["s"]
    assert session.active_event_count == visible.count()
    assert session.active_tokens == visible.aggregate(s=Sum("token_count"))["s"]
    assert session.cumulative_tokens == events.aggregate(s=Sum("token_count"))["s"]
    sums = reported.aggregate(
        p=Sum("prompt_tokens"), c=Sum("completion_tokens"), t=Sum("total_tokens"), n=Count("id")
    )
    assert session.reported_prompt_tokens == (sums["p"] or 0)
    assert session.reported_completion_tokens == (sums["c"] or 0)
    assert session.reported_total_tokens == (sums["t"] or 0)
    assert session.reported_event_count == sums["n"]


def test_it_keeps_seq_gap_free_under_concurrent_service_writers():
    session = make_session()

    def work(thread: int) -> None:
        mine = Session.objects.get(pk=session.pk)
        index = 0
        while index < PER_THREAD:
            if index % 10 < 5:
                services.event_append(session=mine, events=[event(thread, index)])
                index += 1
            else:
                services.event_append(
                    session=mine, events=[event(thread, index + k) for k in range(5)]
                )
                index += 5

    errors = run_threads(THREADS, work)
    assert not errors, errors
    assert Event.objects.filter(session=session).count() == 1 + THREADS * PER_THREAD
    assert_ledger_consistent(session.pk)
    # Each bulk of five is contiguous: nothing interleaves inside one append.
    for thread in range(THREADS):
        seqs = list(
            Event.objects.filter(session=session, content__startswith=f"thread {thread} event ")
            .order_by("seq")
            .values_list("seq", flat=True)
        )
        assert len(seqs) == PER_THREAD
        assert seqs[5:10] == list(range(seqs[5], seqs[5] + 5))


def test_it_keeps_seq_gap_free_under_concurrent_api_writers():
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    cache.clear()
    session = make_session()
    key = Token.objects.create(user=session.owner).key

    def work(thread: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        url = f"/api/v1/sessions/{session.pk}/events"
        for batch in range(5):
            body = [
                {
                    "type": "USER_MESSAGE",
                    "content": f"api {thread} {batch} {k}",
                    "tokenUsage": {"promptTokens": 1, "totalTokens": 2},
                }
                for k in range(5)
            ]
            response = client.post(url, body if batch % 2 else body[0], format="json")
            assert response.status_code == 201, response.content

    errors = run_threads(THREADS, work)
    cache.clear()
    assert not errors, errors
    # Per thread: 3 bulk requests of 5 and 2 single events.
    assert Event.objects.filter(session=session).count() == 1 + THREADS * (2 * 5 + 3)
    assert_ledger_consistent(session.pk)


def test_it_stores_one_event_for_concurrent_retries_of_one_id():
    session = make_session()
    event_id = uuid.uuid4()
    results = []

    def work(thread: int) -> None:
        mine = Session.objects.get(pk=session.pk)
        item = EventInput(
            id=event_id,
            type=EventType.AGENT_MESSAGE,
            content="the one answer",
            token_usage=TokenUsage(prompt_tokens=10, completion_tokens=2, total_tokens=12),
        )
        result = services.event_append(session=mine, events=[item])
        results.append((result.created, result.events[0].id, result.events[0].seq))

    errors = run_threads(4, work)
    assert not errors, errors
    assert sorted(created for created, _, _ in results) == [0, 0, 0, 1]
    assert {(event, seq) for _, event, seq in results} == {(event_id, 2)}
    assert Event.objects.filter(pk=event_id).count() == 1
    assert Event.objects.filter(session=session).count() == 2
    assert_ledger_consistent(session.pk)
    assert Session.objects.get(pk=session.pk).reported_total_tokens == 12


def test_it_reports_a_conflict_for_one_id_raced_into_two_sessions():
    first, second = make_session(), make_session()
    event_id = uuid.uuid4()
    outcomes = []

    def work(thread: int) -> None:
        target = Session.objects.get(pk=(first if thread % 2 else second).pk)
        try:
            services.event_append(
                session=target,
                events=[EventInput(id=event_id, type=EventType.USER_MESSAGE, content="x")],
            )
            outcomes.append(("ok", target.pk))
        except Conflict as exc:
            outcomes.append((exc.code, target.pk))

    errors = run_threads(4, work)
    assert not errors, errors
    owner = Event.objects.get(pk=event_id).session_id
    assert sorted(code for code, _ in outcomes) == [
        "idempotency_conflict",
        "idempotency_conflict",
        "ok",
        "ok",
    ]
    assert all(pk == owner for code, pk in outcomes if code == "ok")
    assert_ledger_consistent(first.pk)
    assert_ledger_consistent(second.pk)


def test_it_deletes_a_session_while_writers_append_to_it():
    """A delete racing appends: it waits for the writer under way and takes everything with
    it; the writers after it find no session (a 404 on every surface), none fails in the
    database, and no row of the session is left behind."""
    session = make_session()
    for index in range(20):
        services.event_append(session=session, events=[event(0, index)])
    deleted: list[bool] = []

    def work(index: int) -> None:
        if index == 0:
            services.session_delete(session=session)
            deleted.append(True)
            return
        for number in range(10):
            try:
                services.event_append(
                    session=Session.objects.get(pk=session.pk), events=[event(index, number)]
                )
            except Session.DoesNotExist:
                return

    errors = run_threads(6, work)
    assert errors == []
    assert deleted == [True]
    assert not Session.objects.filter(pk=session.pk).exists()
    assert not Event.objects.filter(session_id=session.pk).exists()
