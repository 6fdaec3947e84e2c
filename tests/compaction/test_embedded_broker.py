"""The embedded profile's in-memory Celery broker is configured so that kombu prints no "No
hostname was supplied" warning, neither when a worker connects nor on every enqueue."""

from __future__ import annotations

import logging

import pytest
from django.conf import settings

from tests.support.helpers import create_session, request_compaction, wait_for_run

pytestmark = pytest.mark.skipif(
    bool(settings.REDIS_URL), reason="the in-memory broker is the embedded profile's"
)


def _hostname_warnings(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if "No hostname was supplied" in record.getMessage()
    ]


def test_it_connects_to_the_in_memory_broker_without_a_warning(caplog):
    from config.celery import app

    with caplog.at_level(logging.WARNING, logger="kombu"):
        # What a starting worker (embedded or the test fixture) reads for its banner.
        app.connection_for_read().info()
        app.connection_for_write().info()
    assert _hostname_warnings(caplog) == []


def test_it_enqueues_a_compaction_without_a_warning(worker, alice, alice_api, caplog):
    session_id = create_session(alice_api)
    alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        [{"type": "USER_MESSAGE", "content": f"message {n}"} for n in range(6)],
        format="json",
    )
    with caplog.at_level(logging.WARNING, logger="kombu"):
        run = request_compaction(
            alice_api, session_id=session_id, strategy="trim", targetRatio=0.01
        )
        finished = wait_for_run(alice_api, run_id=run["id"])
    assert finished["status"] in ("completed", "failed")
    assert _hostname_warnings(caplog) == []
