"""A PostgreSQL restart during a compaction (issue 42, row 10): PostgreSQL down 6 s while the
summarizer worked; back up, the run's next statement met a stale pooled connection
(`terminating connection due to administrator command`), the run failed and the summarizer's
work was lost. Now the run applies its summary on a fresh connection once the database answers
again, and the summarizer is asked once.

The restart is what the run sees of one, on this test's own database only (the shared server
is never restarted): every connection to it but the test's is terminated (what a restart does
to the pool's connections), and new ones are refused for 6 s (ALLOW_CONNECTIONS false)."""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection

from compaction_app.testkit.provider_standin import ProviderStandIn, slow
from tests.support.helpers import coding_turns, grown_session, request_compaction, wait_for_run

SUMMARY = "## Status\n- Bugs 0-9 fixed with dict lookups."
SUMMARIZER_SECONDS = 2.0
OUTAGE_SECONDS = 6.0

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL"), reason="a database server to restart (PostgreSQL)"
    ),
]


def _outage(database: str, seconds: float) -> None:
    """What the worker sees of a restart: its connections cut, new ones refused meanwhile.
    From the server's maintenance database (a database cannot refuse connections to itself
    from its own session)."""
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        admin.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false')
        try:
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> %s",
                [database, _own_pid()],
            ).fetchall()
            assert cut, "no connection of the worker was open"
            time.sleep(seconds)
        finally:
            admin.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true')


def _own_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_run_survives_a_database_restart_while_its_summarizer_works(worker, alice_api, settings):
    settings.COMPACTION_RETRY_BACKOFF_SECONDS = 0.02
    settings.SUMMARIZER_TIMEOUT_SECONDS = 30
    database = connection.settings_dict["NAME"]
    with ProviderStandIn(default=slow(SUMMARIZER_SECONDS, SUMMARY)) as provider:
        settings.OPENAI_BASE_URL = provider.openai_url
        settings.OPENAI_API_KEY = "sk-test-openai"
        session_id = grown_session(alice_api, events=coding_turns(count=10), summarizer="openai")
        run = request_compaction(alice_api, session_id=session_id)
        # The outage starts once the summarizer has the request, and outlasts it.
        deadline = time.monotonic() + 20
        while not provider.requests:
            assert time.monotonic() < deadline, "the summarizer was never called"
            time.sleep(0.02)
        _outage(database, OUTAGE_SECONDS)
        done = wait_for_run(alice_api, run_id=run["id"], timeout=60)
        assert done["status"] == "completed", done
        summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
        assert summary["summary"] == SUMMARY
        assert len(provider.requests) == 1  # the summarizer's work was kept, not redone
