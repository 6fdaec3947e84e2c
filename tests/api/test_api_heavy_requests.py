"""Per-user concurrency for heavy requests (/context, compaction dry runs, recall): past
HEAVY_REQUESTS_PER_USER running at once, a user's next heavy request is answered 429 at once;
another user's are served; a slot is given back when its request ends, also in error.

The two running requests are held with the limiter itself, as two slow requests in flight
(on the production profile the count lives in Redis, shared by every process)."""

from __future__ import annotations

import sys

import pytest

from sessions_app.heavy import heavy_slot
from tests.support.helpers import coding_turns, grown_session

pytestmark = pytest.mark.django_db


def _heavy_requests(api, session_id: str) -> dict[str, object]:
    base = f"/api/v1/sessions/{session_id}"
    return {
        "GET context": api.get(f"{base}/context"),
        "POST context": api.post(f"{base}/context"),
        "dry run": api.post(f"{base}/compactions", {"dryRun": True}, format="json"),
        "recall": api.post(f"{base}/recall", {"seqs": [1]}, format="json"),
    }


def test_it_answers_a_users_third_concurrent_heavy_request_429_and_serves_another_user(
    alice, alice_api, bob_api, settings
):
    settings.HEAVY_REQUESTS_PER_USER = 2
    alices = grown_session(alice_api, events=coding_turns(count=3), limit=100_000)
    bobs = grown_session(bob_api, events=coding_turns(count=3), limit=100_000)

    with heavy_slot(user_id=alice.pk), heavy_slot(user_id=alice.pk):
        for name, response in _heavy_requests(alice_api, alices).items():
            assert response.status_code == 429, name
            assert response.json()["error"] == "too_many_requests"
            assert response.json()["detail"]
            assert response["Retry-After"] == str(response.json()["retryAfter"]) == "1"
        # Light reads are not counted.
        assert alice_api.get(f"/api/v1/sessions/{alices}/events").status_code == 200
        assert alice_api.get(f"/api/v1/sessions/{alices}/usage").status_code == 200
        for name, response in _heavy_requests(bob_api, bobs).items():
            assert response.status_code == 200, (name, response.json())

    # Both slots given back: every heavy request is served again, one after another.
    for name, response in _heavy_requests(alice_api, alices).items():
        assert response.status_code == 200, (name, response.json())


def test_it_gives_a_slot_back_when_the_heavy_request_fails(alice, alice_api, settings):
    settings.HEAVY_REQUESTS_PER_USER = 2
    session_id = grown_session(alice_api, events=coding_turns(count=2), limit=100_000)
    context = f"/api/v1/sessions/{session_id}/context"
    with heavy_slot(user_id=alice.pk):
        # Rejected inside the slot (a bad format), five times: each gives its slot back.
        for _ in range(5):
            assert alice_api.get(f"{context}?format=xml").status_code == 400
        assert alice_api.get(context).status_code == 200
        with heavy_slot(user_id=alice.pk):
            assert alice_api.get(context).status_code == 429
    assert alice_api.get(context).status_code == 200


def test_it_turns_the_limit_off_with_zero(alice, alice_api, settings):
    settings.HEAVY_REQUESTS_PER_USER = 0
    session_id = grown_session(alice_api, events=coding_turns(count=2), limit=100_000)
    with heavy_slot(user_id=alice.pk), heavy_slot(user_id=alice.pk), heavy_slot(user_id=alice.pk):
        assert alice_api.get(f"/api/v1/sessions/{session_id}/context").status_code == 200


def test_it_lets_a_light_request_take_the_gil_back_within_half_a_millisecond(settings):
    """A server process (config/asgi.py) switches threads every GIL_SWITCH_INTERVAL_MS, not
    Python's 5 ms: a light request beside CPU-bound heavy ones waits that long for the GIL
    after each database round trip (bench/bench_fairness.py measures the p99 it gives)."""
    import config.asgi  # noqa: F401  (the server's entry point sets it on import)

    assert settings.GIL_SWITCH_INTERVAL_MS == 0.5
    assert sys.getswitchinterval() == pytest.approx(0.0005)
