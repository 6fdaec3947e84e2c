from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import sys
import threading
import time
from typing import Any

import pytest

# Django imports stay inside the fixtures so the pure unit tests also run with `-p no:django`.


# How long the interpreter may take to exit once the run is over.
EXIT_GRACE_SECONDS = 60
_exit_status = 1


def pytest_sessionstart(session):
    """.ci/run starts the production-profile run beside this one once the venv the README's
    test command installs is ready: this file says so."""
    started = os.environ.get("LEDGER_CI_STARTED")
    if started and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(started, "a"):
            pass


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


def _remove_sqlite_companions(config) -> None:
    """Django removes the embedded profile's test database file, not SQLite's WAL companions
    (`-wal`, `-shm`) that a live server or worker thread's connection left beside it: remove
    them once the run (this process's: each xdist worker has its own database) is over."""
    if not config.pluginmanager.hasplugin("django"):
        return
    try:
        from django.conf import settings

        database = settings.DATABASES["default"]
    except Exception:
        return
    if database.get("ENGINE") != "django.db.backends.sqlite3":
        return
    name = str((database.get("TEST") or {}).get("NAME") or "")
    if not name or os.path.exists(name):
        return  # kept (--reuse-db) or never made
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
            os.remove(name + suffix)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A test that leaves a thread which never ends (an event loop whose task ignores its
    cancellation, say) would hang the interpreter's exit, and CI with it, after every result
    is printed. Past the grace time, print every thread's stack and leave with a failure.

    Not in a pytest-xdist worker: a worker that is done waits, alive, for the controller to
    end the run, and the controller terminates a worker that does not exit (10 s)."""
    _remove_sqlite_companions(config)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def watchdog() -> None:
        time.sleep(EXIT_GRACE_SECONDS)
        sys.stderr.write(f"\nThe test process did not exit within {EXIT_GRACE_SECONDS} s:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(_exit_status or 1)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()


# The fixtures through which a test reaches the run's profile (its database, and with it the
# worker, the live server and the channel layer those use).
_PROFILE_FIXTURES = frozenset(
    {"db", "transactional_db", "live_url", "gateway_url", "worker", "celery_worker_thread"}
)


def pytest_collection_modifyitems(config, items):
    """A test marked `profile_independent` is left out of the production-profile run in CI
    (`-m "not profile_independent"`): one that reaches the profile's database anyway would then
    never run on PostgreSQL, so the mark is refused on it."""
    wrong = [
        item.nodeid
        for item in items
        if item.get_closest_marker("profile_independent") is not None
        and (
            item.get_closest_marker("django_db") is not None
            or _PROFILE_FIXTURES & set(getattr(item, "fixturenames", ()))
        )
    ]
    if wrong:
        raise pytest.UsageError(
            "marked profile_independent but uses the database: " + ", ".join(wrong[:5])
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Before any fixture is torn down (the database flushed above all): let the gateway's
    after-response announcements of the test's last calls finish."""
    after = sys.modules.get("compaction_app.gateway.after")
    if after is not None:
        after.wait_idle(10)


@pytest.fixture(autouse=True)
def _fresh_cache_and_fast_hashing(request):
    """Throttle counters live in the cache and would leak between tests; password hashing for
    the user fixtures would dominate the run time."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    from django.core.cache import cache

    settings = request.getfixturevalue("settings")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # A search-index pass per append, at once: a delayed pass would outlive the worker's
    # drain (tests/search/test_search_coalescing.py covers the coalescing itself).
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setattr("sessions_app.receivers.INDEX_DELAY_SECONDS", 0)
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _known_bodies_unchanged():
    """Every test through the gateway checks what a later call would reuse (views.KNOWN_BODIES)
    is still what its bytes read as: a caller changing a message it was handed would hand the
    change to every later call of that conversation."""
    views = sys.modules.get("compaction_app.gateway.views")
    if views is not None:
        views.KNOWN_BODIES.clear()
    yield
    views = sys.modules.get("compaction_app.gateway.views")
    if views is None:
        return
    import orjson

    for known in views.KNOWN_BODIES:
        for offset, count in known.bounds:
            kept = {**known.members, known.key: known.items[:count]}
            assert orjson.loads(known.raw[:offset] + b"]}") == kept, (
                "a kept body's messages were changed after it was read"
            )
    views.KNOWN_BODIES.clear()


@pytest.fixture
def make_user(db):
    def make(username: str, *, staff: bool = False):
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_user(
            username=username, password="pw-" + username, is_staff=staff
        )
        return user

    return make


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def staff(make_user):
    return make_user("staff", staff=True)


def _client_for(user) -> Any:
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def api_for():
    return _client_for


@pytest.fixture
def alice_api(alice):
    return _client_for(alice)


@pytest.fixture
def bob_api(bob):
    return _client_for(bob)


@pytest.fixture
def staff_api(staff):
    return _client_for(staff)


@pytest.fixture
def fake():
    """A running ProviderStandIn (local OpenAI and Anthropic wire-format server), closed after."""
    from compaction_app.testkit.provider_standin import ProviderStandIn

    with ProviderStandIn() as server:
        yield server


@pytest.fixture(scope="session")
def celery_worker_thread(django_db_setup, django_db_blocker):
    """A real Celery worker thread on the configured broker (in-memory, or Redis when
    REDIS_URL is set), shared by the tests that need one."""
    from celery.contrib.testing.worker import start_worker

    from config.celery import app

    with (
        django_db_blocker.unblock(),
        start_worker(
            app, perform_ping_check=False, pool="solo", loglevel="WARNING", shutdown_timeout=10
        ) as worker,
    ):
        yield worker


@pytest.fixture
def worker(celery_worker_thread, transactional_db):
    """The shared worker thread, drained before the test's database is flushed: a task the test
    set off (a search index, a webhook) must not hold locks while the tables are truncated."""
    yield celery_worker_thread
    _drain(celery_worker_thread)


def _drain(worker, timeout: float = 30.0) -> None:
    import threading
    import uuid

    from celery.signals import task_postrun

    from compaction_app.tasks import ping

    task_id = str(uuid.uuid4())
    done = threading.Event()

    def seen(**kwargs):
        if kwargs.get("task_id") == task_id:
            done.set()

    task_postrun.connect(seen, weak=False)
    try:
        ping.apply_async(task_id=task_id)
        done.wait(timeout)
    except Exception:  # a broker the test broke on purpose: nothing to drain
        pass
    finally:
        task_postrun.disconnect(seen)


@pytest.fixture(scope="session", autouse=True)
def _close_stray_database_sessions(request):
    """Worker and server threads keep their own PostgreSQL connections; end them before
    pytest-django drops the test database, or the drop fails and the database is left behind."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    request.getfixturevalue("django_db_setup")
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with request.getfixturevalue("django_db_blocker").unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


# Pooled PostgreSQL connections (production profile) by the thread that took each: a thread
# that ends without closing its connection never gives it back to the pool (nothing reclaims
# it), so each one is a slot lost for the rest of the run. Eight such slots, lost by a test's
# own threads, once left the later tests waiting for a connection and timing out
# (PoolTimeout) far from the test that lost them.
_POOLED: dict[int, tuple[threading.Thread, Any, str]] = {}
_POOLED_LOCK = threading.Lock()


def _note_pooled_connection(sender, connection, **kwargs) -> None:
    if getattr(connection, "pool", None) is None:
        return  # SQLite: a connection of its own per thread, nothing shared runs out
    with _POOLED_LOCK:
        _POOLED[id(connection)] = (
            threading.current_thread(),
            connection,
            os.environ.get("PYTEST_CURRENT_TEST", "?"),
        )


def _release_connections_of_ended_threads() -> list[str]:
    """Give back to the pool every connection whose thread ended without closing it; one line
    per connection given back."""
    released = []
    with _POOLED_LOCK:
        for key, (thread, wrapper, test) in list(_POOLED.items()):
            if wrapper.connection is None:
                del _POOLED[key]  # closed: back in the pool
            elif not thread.is_alive():
                del _POOLED[key]
                # The backend's own close (the thread that could call close() is gone).
                with contextlib.suppress(Exception):
                    wrapper._close()
                released.append(f"thread {thread.name!r}, connected during {test}")
    return released


@pytest.fixture(scope="session", autouse=True)
def _watch_pooled_connections(request):
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    from django.db.backends.signals import connection_created

    connection_created.connect(_note_pooled_connection, dispatch_uid="tests-pooled-connections")
    yield
    connection_created.disconnect(dispatch_uid="tests-pooled-connections")


@pytest.fixture(autouse=True)
def _no_pooled_connection_left_by_an_ended_thread(_watch_pooled_connections):
    """A thread the test started must close the database connection it used (a test thread
    that reads through the ORM: `connection.close()` before it returns). The connection is
    given back either way, so later tests keep the whole pool."""
    yield
    released = _release_connections_of_ended_threads()
    if released:
        pytest.fail(
            "a thread ended without closing its pooled database connection: " + "; ".join(released),
            pytrace=False,
        )


@pytest.fixture(scope="session")
def live_url(django_db_setup, django_db_blocker):
    """daphne in a thread of this process, so the server, the Celery worker thread and the
    in-memory channel layer are one process, as in `manage.py serve`. One per test run:
    Twisted's reactor cannot be started twice in a process."""
    from twisted.internet import reactor

    from compaction_app.gateway import forward
    from compaction_app.testkit.daphne_thread import serve_in_thread

    with django_db_blocker.unblock():
        thread, url = serve_in_thread(seconds=10)
        yield url
        # The gateway's pooled upstream connections belong to the server's loop: close them
        # while it runs (left open, aiohttp reports them at exit).
        asyncio.run_coroutine_threadsafe(
            forward.close_sessions(), reactor._asyncioEventloop
        ).result(timeout=10)
        reactor.callFromThread(reactor.stop)
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright (never a downloaded browser). Per module: while
    Playwright runs, its asyncio loop is registered on the main thread, which would make
    Django refuse the ORM in every later test of the process."""
    from playwright.sync_api import sync_playwright

    from compaction_app.testkit.browser import launch_chromium

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        yield browser
        browser.close()


@pytest.fixture
def upstream(settings):
    """The provider stand-in (compaction_app/testkit/provider_standin.py), set as every
    gateway upstream."""
    from compaction_app.testkit.provider_standin import ProviderStandIn

    with ProviderStandIn() as standin:
        settings.LEDGER_OPENAI_UPSTREAM = standin.openai_url
        settings.LEDGER_ANTHROPIC_UPSTREAM = standin.anthropic_url
        settings.LEDGER_GEMINI_UPSTREAM = standin.gemini_url
        yield standin


@pytest.fixture(scope="session")
def gateway_url(live_url):
    """The live server, as the gateway tests call it: the gateway is one more path of the app."""
    return live_url


@pytest.fixture(scope="session")
def gemini_gateway_url(gateway_url):
    """The gateway's Gemini wire: the base URL Gemini CLI (`GOOGLE_GEMINI_BASE_URL`) and
    google-genai (`http_options.base_url`) are given; they add `/{version}/models/…`."""
    return f"{gateway_url}/gateway/gemini"
