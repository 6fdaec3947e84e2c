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


# --- issue 42: one limit on every heavy path, slots freed by their own expiry ---------------


class _Abandoned:
    """Slots taken and never given back, as by a server process killed mid-request (kill -9:
    no `finally` runs). Held here until the test ends."""

    def __init__(self, user_id: object, count: int) -> None:
        self.held = [heavy_slot(user_id=user_id) for _ in range(count)]
        for slot in self.held:
            slot.__enter__()


def test_it_frees_a_killed_servers_slots_by_their_expiry_which_refused_tries_do_not_extend(
    alice, alice_api, settings
):
    """Issue 42, row 5: two heavy requests, the server killed, the client retrying every
    second as `Retry-After: 1` says: still 429 after 330 s, since each refused try refreshed
    the counter's expiry. Each slot now expires on its own, counted from when it was taken."""
    import time

    settings.HEAVY_REQUESTS_PER_USER = 2
    settings.HEAVY_REQUEST_EXPIRY_SECONDS = 2
    session_id = grown_session(alice_api, events=coding_turns(count=2), limit=100_000)
    context = f"/api/v1/sessions/{session_id}/context"
    abandoned = _Abandoned(alice.pk, 2)
    started = time.monotonic()
    statuses = []
    while time.monotonic() - started < 8:
        response = alice_api.get(context)
        statuses.append(response.status_code)
        if response.status_code == 200:
            break
        assert response.status_code == 429
        time.sleep(0.25)  # an eager client: four tries a second
    assert statuses[0] == 429 and statuses[-1] == 200, statuses
    assert time.monotonic() - started < 4
    del abandoned


def _gateway_count(gateway_url: str, wire: str, key: str) -> object:
    import httpx

    if wire == "anthropic":
        return httpx.post(
            f"{gateway_url}/gateway/anthropic/v1/messages/count_tokens",
            json={"model": "claude-3-5-sonnet-20241022", "messages": _LONG_MESSAGES},
            headers={"X-Ledger-Key": key, "anthropic-version": "2023-06-01"},
            timeout=60,
        )
    return httpx.post(
        f"{gateway_url}/gateway/gemini/v1beta/models/gemini-2.5-pro:countTokens",
        json={
            "contents": [
                {"role": "user", "parts": [{"text": m["content"]}]} for m in _LONG_MESSAGES
            ]
        },
        headers={"X-Ledger-Key": key},
        timeout=60,
    )


_LONG_MESSAGES = [{"role": "user", "content": "count these words " * 200}] * 20


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wire", ["anthropic", "gemini"])
def test_it_limits_the_gateways_token_counting_per_user(gateway_url, alice, bob, settings, wire):
    """Issue 42, row 2: 8 parallel 10.8 MB countTokens / count_tokens calls (no upstream, no
    provider key) all ran, and another user's reads waited seconds. Counting takes one of the
    caller's heavy slots; past them, 429 in the provider's shape with Retry-After, at once."""
    from sessions_app.heavy import held_slots
    from tests.support.gateway_live import token_for

    settings.HEAVY_REQUESTS_PER_USER = 2
    alices, bobs = token_for(alice), token_for(bob)
    abandoned = _Abandoned(alice.pk, 2)
    refused = _gateway_count(gateway_url, wire, alices)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "1"
    if wire == "anthropic":
        assert refused.json()["type"] == "error"
        assert refused.json()["error"]["type"] == "rate_limit_error"
    else:
        assert refused.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    # Another user counts as usual.
    assert _gateway_count(gateway_url, wire, bobs).status_code == 200
    del abandoned
    import gc

    gc.collect()
    counted = _gateway_count(gateway_url, wire, alices)
    assert counted.status_code == 200, counted.text
    assert held_slots(user_id=alice.pk) == 0  # given back once answered


@pytest.mark.django_db(transaction=True)
def test_it_limits_mcp_recall_and_dry_runs_per_user(live_url, alice, alice_api, bob, settings):
    """Issue 42, row 3: MCP `ledger_compact` with `dryRun` and `ledger_recall`, 8 at once, had
    no per-user limit (another user's p99 10.9 s, and 500s when the database pool drained).
    They take the caller's heavy slots as their REST twins do."""
    from sessions_app.heavy import held_slots
    from tests.support import mcp_live
    from tests.support.gateway_live import token_for

    settings.HEAVY_REQUESTS_PER_USER = 2
    session_id = grown_session(alice_api, events=coding_turns(count=3), limit=100_000)
    key = token_for(alice)
    calls = {
        "ledger_recall": {"session": session_id, "seqs": [1]},
        "ledger_compact": {"session": session_id, "dryRun": True},
    }
    abandoned = _Abandoned(alice.pk, 2)
    for tool, arguments in calls.items():
        result = mcp_live.call(live_url, key, tool, **arguments)
        assert result.is_error, (tool, result)
        body = mcp_live.payload(result)
        assert body["error"] == "too_many_requests" and body["status"] == 429, body
    # The light tools are not counted.
    usage = mcp_live.call(live_url, key, "ledger_usage", session=session_id)
    assert not usage.is_error
    del abandoned
    import gc

    gc.collect()
    for tool, arguments in calls.items():
        result = mcp_live.call(live_url, key, tool, **arguments)
        assert not result.is_error, (tool, mcp_live.payload(result))
    assert held_slots(user_id=alice.pk) == 0
