"""What a provider call costs the gateway: its own ASGI handler (no site middleware, no thread
per request), its sync work on the gateway's own threads, four SQL statements in the
steady state, and one announcement of the call's appends, after the response."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from asgiref.sync import async_to_sync
from celery import current_task
from channels.testing import HttpCommunicator
from django.db import connection
from django.db.backends.signals import connection_created

from compaction_app.gateway import after, workers
from compaction_app.gateway.asgi import GatewayHandler, with_gateway
from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Session
from sessions_app.signals import events_appended
from tests.support.gateway_live import openai_client, token_for, wait_until

SYSTEM = {"role": "system", "content": "You are a terse coding agent."}
USER = {"role": "user", "content": "List the files."}
CHAT = "/gateway/openai/v1/chat/completions"


class Statements:
    """Every SQL statement run by any thread's new database connection while installed, but
    for those of Celery tasks (a search-index pass the shared worker thread runs meanwhile)."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        self.lock = threading.Lock()
        self.wrapped: list = []

    def __call__(self, execute, sql, params, many, context):
        if not current_task:
            with self.lock:
                self.sql.append(sql)
        return execute(sql, params, many, context)

    def install(self, sender, connection, **kwargs) -> None:
        # The gateway's threads live on and reconnect the same wrapper: install once.
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)
            self.wrapped.append(connection)

    def uninstall(self) -> None:
        for wrapped in self.wrapped:
            if self in wrapped.execute_wrappers:
                wrapped.execute_wrappers.remove(self)


@pytest.fixture
def statements():
    recorder = Statements()
    connection_created.connect(recorder.install, dispatch_uid="test-gateway-statements")
    # New gateway threads, so their connections are new too (SQLite's stay open otherwise).
    workers.restart()
    yield recorder
    connection_created.disconnect(dispatch_uid="test-gateway-statements")
    recorder.uninstall()


@pytest.fixture
def announced():
    received: list[dict] = []

    def receiver(sender, **kwargs):
        received.append(kwargs)

    events_appended.connect(receiver, dispatch_uid="test-gateway-announced")
    yield received
    events_appended.disconnect(dispatch_uid="test-gateway-announced")


@pytest.mark.django_db(transaction=True)
def test_it_serves_the_gateway_without_the_sites_middleware(gateway_url, upstream, alice):
    key = token_for(alice)
    gateway = httpx.post(
        gateway_url + CHAT,
        json={"model": "gpt-4o", "messages": [SYSTEM, {"role": "user", "content": "Hi"}]},
        headers={"X-Ledger-Key": key, "X-Ledger-Session": "plain", "Authorization": "Bearer k"},
    )
    site = httpx.get(gateway_url + "/api/v1/sessions", headers={"Authorization": f"Token {key}"})
    assert gateway.status_code == 200 and site.status_code == 200
    # SecurityMiddleware's headers on both; the site's clickjacking, session and CSRF
    # middleware only on the site.
    assert gateway.headers["X-Content-Type-Options"] == "nosniff"
    assert site.headers["X-Content-Type-Options"] == "nosniff"
    assert site.headers["X-Frame-Options"] == "DENY"
    assert "X-Frame-Options" not in gateway.headers
    assert "Cookie" not in gateway.headers.get("Vary", "")
    assert "set-cookie" not in gateway.headers


@pytest.mark.django_db
def test_it_redirects_the_gateway_to_https_when_the_site_does(settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["ledger.example"]
    handler = GatewayHandler()

    async def scenario():
        communicator = HttpCommunicator(
            handler, "POST", CHAT, body=b"{}", headers=[(b"host", b"ledger.example")]
        )
        return await communicator.get_response()

    response = async_to_sync(scenario)()
    assert response["status"] == 301
    assert dict(response["headers"])[b"Location"] == b"https://ledger.example" + CHAT.encode()


def test_it_routes_only_paths_under_gateway_to_the_gateway():
    seen: list[str] = []

    def app(name):
        async def serve(scope, receive, send):
            seen.append(name)

        return serve

    router = with_gateway(app("site"), app("gateway"))

    def route(path, root_path="", kind="http"):
        async def scenario():
            await router({"type": kind, "path": path, "root_path": root_path}, None, None)

        async_to_sync(scenario)()
        return seen[-1]

    assert route("/gateway/openai/v1/models") == "gateway"
    assert route("/ledger/gateway/openai/v1/models", root_path="/ledger") == "gateway"
    assert route("/gatewayx/openai") == "site"
    assert route("/api/v1/sessions") == "site"
    assert route("/gateway/openai/v1/models", kind="websocket") == "site"


@pytest.mark.django_db(transaction=True)
def test_it_records_a_steady_call_in_few_statements(gateway_url, upstream, alice, statements):
    client = openai_client(gateway_url, key=token_for(alice), session="steady")
    history = [SYSTEM, {"role": "user", "content": "List the files."}]
    first = client.chat.completions.create(model="gpt-4o", messages=history)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now fix the test."},
    ]
    after.wait_idle()
    statements.sql.clear()
    client.chat.completions.create(model="gpt-4o", messages=history)
    after.wait_idle()
    # Caller and session in one look-up, the session's recent threads in one more; per
    # append (the new message, the reply) one UPDATE ... RETURNING of the counters and one
    # INSERT, which PostgreSQL runs as one statement outside a transaction. The thread's row
    # is brought up to date in the reply's append (its transaction; on PostgreSQL its one
    # statement): one commit per recorded append, none of the thread's own. Once the
    # response is sent, off the call's path (after.py): one SELECT of its thread's previous
    # call (what its cache outcome is read against), then the call's row and its session's
    # call counters in one transaction (one INSERT, one UPDATE); the usage push that follows
    # reads counters: no statement. The caller-and-session look-up also says that no budget
    # applies: none is read.
    kinds = [sql.split()[0].upper() for sql in statements.sql]
    row = next(
        i
        for i, sql in enumerate(statements.sql)
        if sql.startswith('INSERT INTO "sessions_app_call"')
    )
    assert len(statements.sql) == row + 2, statements.sql
    assert statements.sql[row + 1].startswith('UPDATE "sessions_app_session"'), statements.sql
    previous = row - 1
    if connection.vendor == "sqlite":
        assert kinds[previous] == "BEGIN", statements.sql
        previous -= 1
    assert '"prefix"' in statements.sql[previous] and kinds[previous] == "SELECT", statements.sql
    assert not any("sessions_app_budget" in sql and "EXISTS" not in sql for sql in statements.sql)
    kinds = kinds[:previous]
    statements.sql[:] = statements.sql[:previous]
    if connection.vendor == "postgresql":
        assert kinds == ["SELECT", "SELECT", "WITH", "WITH"], statements.sql
        assert "sessions_app_thread" in statements.sql[-1], statements.sql
    else:
        # SQLite's transactions start with a statement (BEGIN IMMEDIATE); their commits do
        # not run one. The thread's UPDATE is inside the reply's transaction.
        expected = [
            "SELECT",
            "SELECT",
            *("BEGIN", "UPDATE", "INSERT"),
            *("BEGIN", "UPDATE", "UPDATE", "INSERT"),
        ]
        assert kinds == expected, statements.sql
        assert "sessions_app_thread" in statements.sql[-2], statements.sql


@pytest.mark.django_db(transaction=True)
def test_it_announces_a_calls_appends_once(gateway_url, upstream, alice, announced):
    client = openai_client(gateway_url, key=token_for(alice), session="announce")
    history = [SYSTEM, {"role": "user", "content": "Hi"}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    after.wait_idle()
    assert len(announced) == 1
    session = Session.objects.get(client_key="announce")
    (signal,) = announced
    assert signal["session_id"] == session.pk
    assert signal["event_types"] == ["AGENT_MESSAGE", "SYSTEM_PROMPT", "USER_MESSAGE"]
    assert len(signal["event_ids"]) == 3
    # The row as the reply's append left it.
    assert signal["session"].event_count == 3


@pytest.mark.django_db(transaction=True)
def test_it_announces_a_streamed_calls_appends_once(gateway_url, upstream, alice, announced):
    client = openai_client(gateway_url, key=token_for(alice), session="announce-stream")
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "Hi"}], stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    after.wait_idle()
    assert len(announced) == 1
    assert announced[0]["event_types"] == ["AGENT_MESSAGE", "SYSTEM_PROMPT", "USER_MESSAGE"]


@pytest.mark.django_db(transaction=True)
def test_it_announces_the_requests_messages_when_the_upstream_fails(
    gateway_url, upstream, alice, announced
):
    upstream.script(Step(kind="error", status=500))
    client = openai_client(gateway_url, key=token_for(alice), session="announce-failed")
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "Hi"}]
        )
    after.wait_idle()
    assert len(announced) == 1
    assert announced[0]["event_types"] == ["SYSTEM_PROMPT", "USER_MESSAGE"]


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_orm_on_gateway_threads_and_sends_the_request_signals_once(
    gateway_url, upstream, alice
):
    from django.core import signals

    seen: list[tuple[str, str]] = []

    def started(sender, **kwargs):
        seen.append(("started", threading.current_thread().name))

    def finished(sender, **kwargs):
        seen.append(("finished", threading.current_thread().name))

    statement_threads: list[str] = []

    def record(execute, sql, params, many, context):
        if not current_task:  # a search-index pass the shared worker thread runs meanwhile
            statement_threads.append(threading.current_thread().name)
        return execute(sql, params, many, context)

    def install(sender, connection, **kwargs):
        if record not in connection.execute_wrappers:
            connection.execute_wrappers.append(record)

    workers.restart()
    signals.request_started.connect(started, dispatch_uid="test-hot-started")
    signals.request_finished.connect(finished, dispatch_uid="test-hot-finished")
    connection_created.connect(install, dispatch_uid="test-hot-threads")
    try:
        client = openai_client(gateway_url, key=token_for(alice), session="threads")
        client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, USER])
        after.wait_idle()
        # request_finished goes once the response is sent: the client may be faster.
        wait_until(lambda: len(seen) >= 2)
    finally:
        signals.request_started.disconnect(dispatch_uid="test-hot-started")
        signals.request_finished.disconnect(dispatch_uid="test-hot-finished")
        connection_created.disconnect(dispatch_uid="test-hot-threads")
    # Both signals, once each, inline on the server's event loop thread: no thread was
    # started to send them.
    assert [kind for kind, _ in seen] == ["started", "finished"]
    assert seen[0][1] == seen[1][1] == "daphne"
    # Every statement of the call ran on a gateway thread (or the announcement's worker
    # thread after the response), none on a thread of the request's own.
    assert statement_threads
    assert {name.split("_")[0] for name in statement_threads} <= {"gateway-db", "asyncio"}


@pytest.mark.django_db(transaction=True)
def test_it_hands_a_hops_postgresql_connection_back_when_the_hop_ends():
    from django.db import connections

    def query() -> tuple[str, bool]:
        Session.objects.exists()
        return threading.current_thread().name, connections["default"].connection is not None

    def holds() -> bool:
        return connections["default"].connection is not None

    async def scenario():
        first = await workers.run(query)
        # The executor has one thread or more; ask each of them.
        held = [await workers.run(holds) for _ in range(workers.MAX_THREADS * 2)]
        return first, held

    (name, connected), held = async_to_sync(scenario)()
    assert name.startswith("gateway-db") and connected
    if connection.vendor == "postgresql":
        # Back to the pool: nothing is held between hops (or while the upstream answers).
        assert not any(held)
    else:
        # SQLite's connection is a file handle: it stays open with its thread.
        assert any(held)
