"""`event_append`'s two ways: the direct one (one UPDATE ... RETURNING, one INSERT; on
PostgreSQL both in one statement) and the careful one it falls back to when a client-supplied
id is already stored."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from sessions_app import append as append_module
from sessions_app.errors import Conflict, Unprocessable
from sessions_app.models import Event, EventType, Session, Thread
from sessions_app.services import (
    MAX_REPORTED_TOTAL,
    EventInput,
    RowUpdate,
    TokenUsage,
    event_append,
    session_create,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session(alice):
    return session_create(owner=alice, model="gpt-4o", settings={"autoCompact": False})


# What the usage push may cost once an append is announced: USAGE_UPDATED carries REST
# /usage's own document (sessions_app.scope.usage_document), whose bill figures come from the
# session's counters and whose context figures may read the session's threads (cached). It runs
# in the events_appended receiver, which the append schedules for after its commit: not the
# append's statements, and bounded (it does not grow with the events appended).
USAGE_PUSH_STATEMENTS = 2


class Captured(CaptureQueriesContext):
    """The statements run inside the block, split where the append announced its events
    (sessions_app.append schedules `announce_appended` for after its commit; on PostgreSQL's
    one-statement path there is no transaction, so it runs at once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(connection)
        self.marks: list[int] = []
        original = append_module.announce_appended

        def marked(**kwargs: object) -> None:
            self.marks.append(len(connection.queries_log))
            original(**kwargs)

        monkeypatch.setattr(append_module, "announce_appended", marked)

    def _cut(self) -> int:
        return self.marks[0] - self.initial_queries if self.marks else len(self.captured_queries)

    def own(self, *, control: bool = False) -> list[str]:
        """The append's own statements (transaction control left out unless `control`)."""
        return _without_control(self.captured_queries[: self._cut()], control)

    def pushed(self) -> list[str]:
        """What its announcement ran (the usage push, the auto-compaction check)."""
        return _without_control(self.captured_queries[self._cut() :], False)


def _without_control(queries: list[dict[str, str]], control: bool) -> list[str]:
    control_verbs = {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"}
    return [
        q["sql"] for q in queries if control or q["sql"].split()[0].upper() not in control_verbs
    ]


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Captured:
    return Captured(monkeypatch)


def statements(captured: Captured) -> list[str]:
    # Transaction control is not a statement of the append's own.
    return captured.own()


def user(text: str, *, event_id: uuid.UUID | None = None, **extra) -> EventInput:
    return EventInput(type=EventType.USER_MESSAGE, content=text, id=event_id, **extra)


def direct_statements() -> int:
    """How many statements the direct way takes: the UPDATE and the INSERT, which
    PostgreSQL runs as one."""
    return 1 if connection.vendor == "postgresql" else 2


def test_it_appends_with_one_update_and_one_insert(session, captured):
    with captured:
        result = event_append(session=session, events=[user("a"), user("b")])
    sql = statements(captured)
    if connection.vendor == "postgresql":
        (statement,) = sql
        assert statement.startswith("WITH updated AS (UPDATE") and "RETURNING" in statement
        assert "inserted AS (INSERT" in statement
    else:
        assert len(sql) == 2, sql
        assert sql[0].startswith("UPDATE") and "RETURNING" in sql[0]
        assert sql[1].startswith("INSERT")
    # The row it returns is the row as committed, counters included.
    assert result.session.last_seq == 2 == result.session.event_count
    assert result.session.active_tokens == Session.objects.get(pk=session.pk).active_tokens
    assert [e.seq for e in result.events] == [1, 2]
    # Once committed, the usage push: a fixed number of reads, none of them of the events.
    after = captured.pushed()
    assert len(after) <= USAGE_PUSH_STATEMENTS, after
    assert all(sql.startswith("SELECT") and "sessions_app_event" not in sql for sql in after)


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement append is PostgreSQL's"
)
def test_it_appends_in_one_round_trip_outside_a_transaction(session, captured):
    with captured:
        event_append(session=session, events=[user("a")])
    # No BEGIN and no COMMIT: the statement commits alone.
    assert [sql.split()[0] for sql in captured.own(control=True)] == ["WITH"]


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement append is PostgreSQL's"
)
def test_it_numbers_the_events_of_concurrent_one_statement_appends_in_order(session):
    import threading

    from django.db import connections

    def append(number: int) -> None:
        try:
            for turn in range(10):
                event_append(
                    session=session, events=[user(f"{number}-{turn}-a"), user(f"{number}-{turn}-b")]
                )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=append, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seqs = list(Event.objects.filter(session=session).order_by("seq").values_list("seq", "content"))
    assert [seq for seq, _ in seqs] == list(range(1, 81))
    # Each append's two events are consecutive.
    for (seq_a, a), (seq_b, b) in zip(seqs[::2], seqs[1::2], strict=True):
        assert a.endswith("-a") and b == a[:-1] + "b" and seq_b == seq_a + 1
    row = Session.objects.get(pk=session.pk)
    assert row.last_seq == row.event_count == 80


def test_it_inserts_new_ids_without_looking_them_up(session, captured):
    ids = [uuid.uuid4(), uuid.uuid4()]
    with captured:
        event_append(
            session=session, events=[user("a", event_id=ids[0]), user("b", event_id=ids[1])]
        )
    assert len(statements(captured)) == direct_statements()
    assert list(Event.objects.filter(session=session).values_list("id", flat=True)) == ids


def test_it_returns_a_stored_id_inside_the_callers_transaction(session):
    stored = uuid.uuid4()
    first = event_append(session=session, events=[user("a", event_id=stored)]).events[0]
    with transaction.atomic():
        # The direct way's insert fails on the stored id; the careful way must still find
        # the caller's transaction usable (PostgreSQL aborts a transaction on an error).
        result = event_append(
            session=session, events=[user("a", event_id=stored), user("b", event_id=uuid.uuid4())]
        )
        assert Session.objects.get(pk=session.pk).event_count == 2
    assert result.created == 1
    assert result.events[0].pk == first.pk and result.events[0].seq == 1
    assert result.events[1].seq == 2
    assert Event.objects.filter(session=session).count() == 2


def test_it_refuses_a_stored_id_with_another_body_and_stores_nothing(session):
    stored = uuid.uuid4()
    event_append(session=session, events=[user("a", event_id=stored)])
    with pytest.raises(Conflict):
        event_append(session=session, events=[user("changed", event_id=stored), user("new")])
    assert Session.objects.get(pk=session.pk).event_count == 1
    assert Event.objects.filter(session=session).count() == 1


def test_it_saves_session_updates_in_the_counters_update(session, captured):
    with captured:
        result = event_append(
            session=session,
            events=[user("a")],
            session_updates={"gateway_prefix_len": 7, "gateway_prefix_hash": "abc"},
        )
    assert len(statements(captured)) == direct_statements()
    assert (result.session.gateway_prefix_len, result.session.gateway_prefix_hash) == (7, "abc")
    row = Session.objects.get(pk=session.pk)
    assert (row.gateway_prefix_len, row.gateway_prefix_hash) == (7, "abc")


def test_it_leaves_session_updates_unsaved_when_nothing_is_new(session):
    stored = uuid.uuid4()
    event_append(session=session, events=[user("a", event_id=stored)])
    result = event_append(
        session=session,
        events=[user("a", event_id=stored)],
        session_updates={"gateway_prefix_len": 9},
    )
    assert result.created == 0
    assert Session.objects.get(pk=session.pk).gateway_prefix_len == 0


def test_it_keeps_the_reported_totals_bound_and_stores_nothing(session):
    Session.objects.filter(pk=session.pk).update(reported_total_tokens=MAX_REPORTED_TOTAL - 5)
    usage = TokenUsage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    with pytest.raises(Unprocessable) as refused:
        event_append(session=session, events=[user("a", token_usage=usage)])
    assert refused.value.code == "token_usage_total_exceeded"
    row = Session.objects.get(pk=session.pk)
    assert row.event_count == 0 and row.reported_total_tokens == MAX_REPORTED_TOTAL - 5


def test_it_counts_a_replayed_bounded_usage_as_a_replay_not_as_new_tokens(session):
    # Near the bound, a retry of a stored event with usage must not be refused: the direct
    # way's bound counts it, the careful way knows it is a replay.
    stored = uuid.uuid4()
    usage = TokenUsage(prompt_tokens=3, completion_tokens=3, total_tokens=6)
    event_append(session=session, events=[user("a", event_id=stored, token_usage=usage)])
    Session.objects.filter(pk=session.pk).update(reported_total_tokens=MAX_REPORTED_TOTAL - 1)
    result = event_append(session=session, events=[user("a", event_id=stored, token_usage=usage)])
    assert result.created == 0


def test_it_updates_another_row_in_the_appends_own_statements(session, captured):
    thread = Thread.objects.create(session=session, key="t")

    def also(calls: int, length: int) -> RowUpdate:
        return RowUpdate(
            model=Thread, pk=thread.pk, deltas={"calls": calls}, values={"length": length}
        )

    stored = uuid.uuid4()
    with captured:
        event_append(session=session, events=[user("a", event_id=stored)], also_update=also(1, 5))
    # The same statements as without it on PostgreSQL (a part of its one statement); one
    # more inside the append's transaction on SQLite.
    assert len(statements(captured)) == (1 if connection.vendor == "postgresql" else 3)
    row = Thread.objects.get(pk=thread.pk)
    assert (row.calls, row.length) == (1, 5)
    # A replay (the careful way) applies it too; counters add up.
    event_append(session=session, events=[user("a", event_id=stored)], also_update=also(2, 6))
    row = Thread.objects.get(pk=thread.pk)
    assert (row.calls, row.length) == (3, 6)
    # A refused append applies nothing.
    with pytest.raises(Conflict):
        event_append(session=session, events=[user("b", event_id=stored)], also_update=also(5, 9))
    row = Thread.objects.get(pk=thread.pk)
    assert (row.calls, row.length) == (3, 6)


def test_it_takes_a_callers_count_instead_of_counting_again(session, monkeypatch):
    # The gateway counts each new message for its window check before it appends them.
    from sessions_app import tokens

    counter = tokens.counter_for_model(session.model)
    counted: list[str] = []
    real = counter.count_batch
    monkeypatch.setattr(counter, "count_batch", lambda texts: counted.extend(texts) or real(texts))
    before = Session.objects.get(pk=session.pk).ledger_tokens
    result = event_append(
        session=session, events=[user("counted before", token_count=7), user("not yet")]
    )
    assert [event.token_count for event in result.events][0] == 7
    assert "counted before" not in counted and "not yet" in counted
    stored = Session.objects.get(pk=session.pk)
    assert stored.ledger_tokens == before + 7 + result.events[1].token_count
