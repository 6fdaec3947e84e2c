"""Sessions over the REST API: create, settings, list, get/patch/delete, isolation and auth."""

from __future__ import annotations

import json
import uuid

import pytest
from django.middleware.csrf import get_token
from django.test import RequestFactory
from rest_framework.test import APIClient

from sessions_app.models import Event, EventType, Session
from sessions_app.session_settings import DEFAULTS

SESSIONS = "/api/v1/sessions"


def create(api, **body):
    body.setdefault("model", "gpt-4o")
    response = api.post(SESSIONS, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.mark.parametrize(
    ("model", "limit", "encoding"),
    [
        ("gpt-4o", 128_000, "o200k_base"),
        ("claude-3.5-sonnet", 200_000, "cl100k_base"),
        ("gemini-3-pro", 1_000_000, "cl100k_base"),
    ],
)
def test_it_resolves_the_context_limit_of_known_models(alice_api, model, limit, encoding):
    session = create(alice_api, model=model)
    assert session["contextLimit"] == limit
    assert session["encoding"] == encoding
    assert session["model"] == model
    assert session["owner"] == "alice"
    assert session["eventCount"] == 0
    assert session["contextTokens"] == 0


def test_it_refuses_an_unknown_model_without_context_limit(alice_api):
    response = alice_api.post(SESSIONS, {"model": "my-local-llm"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "unknown_model"
    assert body["detail"]
    assert "model" in body["fields"]
    assert not Session.objects.exists()


def test_it_accepts_an_unknown_model_with_context_limit(alice_api):
    session = create(alice_api, model="my-local-llm", contextLimit=32_768)
    assert session["contextLimit"] == 32_768
    assert session["encoding"] == "cl100k_base"


def test_it_lets_a_known_model_override_its_limit(alice_api):
    assert create(alice_api, model="gpt-4o", contextLimit=1000)["contextLimit"] == 1000


@pytest.mark.parametrize("limit", [0, -5, 1.5, "1000", True, 10**12])
def test_it_refuses_a_bad_context_limit(alice_api, limit):
    response = alice_api.post(
        SESSIONS, {"model": "my-local-llm", "contextLimit": limit}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["error"] in ("invalid_context_limit", "invalid_request")
    assert "contextLimit" in body["fields"]
    assert not Session.objects.exists()


def test_it_fills_settings_defaults(alice_api):
    session = create(alice_api)
    assert session["settings"] == {
        "autoCompact": True,
        "compactThreshold": 0.8,
        "hardLimitThreshold": 0.95,
        "fitTargetRatio": 0.5,
        "cooldownSeconds": 60,
        "strategy": "summarize",
        "summarizer": "local",
        "maxSummaryTokens": None,
        "keepRecentEvents": 2,
        "refreshThresholdTokens": 800_000,
    }
    assert session["settings"] == DEFAULTS


def test_it_merges_given_settings_over_defaults(alice_api):
    session = create(
        alice_api, settings={"strategy": "trim", "compactThreshold": 0.7, "autoCompact": False}
    )
    assert session["settings"]["strategy"] == "trim"
    assert session["settings"]["compactThreshold"] == 0.7
    assert session["settings"]["autoCompact"] is False
    assert session["settings"]["keepRecentEvents"] == 2


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"colour": "blue"}, "settings.colour"),
        ({"autoCompact": "yes"}, "settings.autoCompact"),
        ({"compactThreshold": "0.8"}, "settings.compactThreshold"),
        ({"compactThreshold": 1.5}, "settings.compactThreshold"),
        ({"cooldownSeconds": 1.5}, "settings.cooldownSeconds"),
        ({"keepRecentEvents": -1}, "settings.keepRecentEvents"),
        ({"strategy": "shred"}, "settings.strategy"),
        ({"summarizer": 7}, "settings.summarizer"),
        ({"compactThreshold": 0.9, "hardLimitThreshold": 0.5}, "settings.compactThreshold"),
        ([1, 2], "settings"),
        ({"\ud800": 1}, None),
    ],
)
def test_it_refuses_invalid_settings(alice_api, given, field):
    # Raw JSON: the test client's own renderer cannot encode a lone surrogate.
    raw = json.dumps({"model": "gpt-4o", "settings": given})
    response = alice_api.post(SESSIONS, raw, content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_settings"
    assert body["detail"]
    if field is not None:
        assert field in body["fields"]
    assert not Session.objects.exists()


def test_it_stores_the_system_prompt_as_event_one(alice_api):
    session = create(alice_api, systemPrompt="You are terse.")
    events = alice_api.get(f"{SESSIONS}/{session['id']}/events").json()["results"]
    assert [(e["seq"], e["type"], e["content"]) for e in events] == [
        (1, "SYSTEM_PROMPT", "You are terse.")
    ]
    assert session["eventCount"] == 1
    assert session["contextTokens"] == events[0]["tokenCount"] + 3


def test_it_paginates_the_session_list(alice_api, settings):
    settings.API_PAGE_SIZE = 2
    ids = {create(alice_api, title=f"s{i}")["id"] for i in range(5)}
    first = alice_api.get(SESSIONS).json()
    assert first["count"] == 5
    assert len(first["results"]) == 2
    assert first["next"]
    seen = [s["id"] for s in first["results"]]
    page = first
    while page["next"]:
        page = alice_api.get(page["next"]).json()
        seen += [s["id"] for s in page["results"]]
    assert len(seen) == 5
    assert set(seen) == ids
    assert len(alice_api.get(SESSIONS, {"pageSize": 4}).json()["results"]) == 4


def test_it_gets_patches_and_deletes_a_session(alice_api):
    session = create(alice_api, title="old", systemPrompt="sys")
    url = f"{SESSIONS}/{session['id']}"
    assert alice_api.get(url).json()["title"] == "old"
    response = alice_api.patch(
        url, {"title": "new", "contextLimit": 5000, "settings": {"strategy": "trim"}}, format="json"
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["title"] == "new"
    assert body["contextLimit"] == 5000
    assert body["settings"]["strategy"] == "trim"
    # Settings not named keep their values.
    assert body["settings"]["compactThreshold"] == 0.8
    assert alice_api.get(url).json()["title"] == "new"
    response = alice_api.delete(url)
    assert response.status_code == 204
    assert alice_api.get(url).status_code == 404
    assert not Session.objects.exists()
    assert not Event.objects.exists()


@pytest.mark.parametrize(
    ("body", "error", "field"),
    [
        ({"model": "gpt-4"}, "invalid_request", "model"),
        ({"contextLimit": 0}, "invalid_context_limit", "contextLimit"),
        ({"settings": {"bogus": 1}}, "invalid_settings", "settings.bogus"),
        ({"title": 5}, "invalid_request", "title"),
    ],
)
def test_it_refuses_bad_patches(alice_api, body, error, field):
    session = create(alice_api, title="keep")
    url = f"{SESSIONS}/{session['id']}"
    response = alice_api.patch(url, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == error
    assert field in response.json()["fields"]
    after = alice_api.get(url).json()
    assert after == session


def test_it_hides_other_users_sessions_on_every_endpoint(alice_api, bob_api):
    session = create(alice_api, systemPrompt="secret")
    event_id = Event.objects.get(session_id=session["id"]).id
    base = f"{SESSIONS}/{session['id']}"
    for method, url, body in [
        ("get", base, None),
        ("patch", base, {"title": "mine"}),
        ("delete", base, None),
        ("get", f"{base}/events", None),
        ("post", f"{base}/events", {"type": "USER_MESSAGE", "content": "hi"}),
        ("get", f"{base}/events/{event_id}", None),
        ("patch", f"{base}/events/{event_id}", {"pinned": True}),
        ("get", f"{base}/usage", None),
        ("get", f"{base}/context", None),
    ]:
        response = getattr(bob_api, method)(url, body, format="json")
        assert response.status_code == 404, (method, url, response.content)
        assert response.json()["error"] == "not_found"
    assert bob_api.get(SESSIONS).json()["count"] == 0
    stored = Session.objects.get(pk=session["id"])
    assert stored.title == ""
    assert stored.event_count == 1
    assert Event.objects.get(pk=event_id).pinned is False


def test_it_returns_404_for_a_missing_or_malformed_session_id(alice_api):
    assert alice_api.get(f"{SESSIONS}/{uuid.uuid4()}").status_code == 404
    assert alice_api.get(f"{SESSIONS}/not-a-uuid").json()["error"] == "not_found"


def test_it_lets_staff_see_every_session(alice_api, bob_api, staff_api):
    mine = create(alice_api)
    create(bob_api)
    assert staff_api.get(SESSIONS).json()["count"] == 2
    assert alice_api.get(SESSIONS).json()["count"] == 1
    assert staff_api.get(f"{SESSIONS}/{mine['id']}").json()["owner"] == "alice"
    assert staff_api.get(f"{SESSIONS}/{mine['id']}/usage").status_code == 200


def test_it_requires_authentication(alice):
    client = APIClient()
    for method, url in [
        ("get", SESSIONS),
        ("post", SESSIONS),
        ("get", "/api/v1/models"),
        ("post", "/api/v1/tokens/count"),
    ]:
        response = getattr(client, method)(url, {"model": "gpt-4o"}, format="json")
        assert response.status_code == 401, url
        assert response.json()["error"] == "not_authenticated"
        assert response.json()["detail"]
    assert not Session.objects.exists()


def test_it_says_the_scheme_is_token_when_a_bearer_token_is_sent(alice):
    from rest_framework.authtoken.models import Token

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {Token.objects.create(user=alice).key}")
    response = client.get(SESSIONS)
    assert response.status_code == 401
    body = response.json()
    assert body["error"] == "not_authenticated"
    assert "Authorization: Token <key>" in body["detail"]
    # Without any credential, the usual words.
    assert "Token <key>" not in APIClient().get(SESSIONS).json()["detail"]


def test_it_refuses_a_bad_token(alice):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token nope")
    response = client.get(SESSIONS)
    assert response.status_code == 401
    assert response.json()["error"] == "authentication_failed"


def test_it_accepts_the_session_cookie(alice):
    client = APIClient()
    assert client.login(username="alice", password="pw-alice")
    session = create(client)
    assert client.get(f"{SESSIONS}/{session['id']}").json()["owner"] == "alice"


def test_it_enforces_csrf_for_cookie_posts(alice):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)
    # Reads need no token.
    assert client.get(SESSIONS).status_code == 200
    response = client.post(SESSIONS, {"model": "gpt-4o"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"] == "permission_denied"
    assert "CSRF" in response.json()["detail"]
    assert not Session.objects.exists()

    token = get_token(RequestFactory().get("/"))
    client.cookies["csrftoken"] = token
    response = client.post(SESSIONS, {"model": "gpt-4o"}, format="json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201, response.json()
    assert Session.objects.filter(owner=alice).count() == 1


def test_it_needs_no_csrf_token_with_token_auth(alice):
    from rest_framework.authtoken.models import Token

    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=alice).key}")
    assert client.post(SESSIONS, {"model": "gpt-4o"}, format="json").status_code == 201


def test_it_counts_events_on_the_session(alice_api):
    session = create(alice_api, systemPrompt="sys")
    alice_api.post(
        f"{SESSIONS}/{session['id']}/events",
        [
            {"type": "USER_MESSAGE", "content": "a"},
            {"type": "LOCAL_SYSTEM_MESSAGE", "content": "note"},
        ],
        format="json",
    )
    body = alice_api.get(f"{SESSIONS}/{session['id']}").json()
    assert body["eventCount"] == 3
    stored = Event.objects.filter(session_id=session["id"]).exclude(
        type=EventType.LOCAL_SYSTEM_MESSAGE
    )
    assert body["contextTokens"] == sum(e.token_count for e in stored) + 3
