"""Query parameters of every endpoint: an empty or malformed `limit`, `after`, `maxTokens`,
`reserveTokens`, `page` or `pageSize` is a 400 that names the parameter, never the default."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.support.helpers import append_events, coding_turns, create_session

pytestmark = pytest.mark.django_db

MALFORMED = ["", "abc", "1.5", " 5", "１", "-"]

# (method, path template, parameter, other query parameters)
ENDPOINTS = [
    ("get", "/api/v1/sessions", "page", {}),
    ("get", "/api/v1/sessions", "pageSize", {}),
    ("get", "/api/v1/sessions/{id}/events", "after", {}),
    ("get", "/api/v1/sessions/{id}/events", "limit", {}),
    ("get", "/api/v1/sessions/{id}/context", "maxTokens", {}),
    ("get", "/api/v1/sessions/{id}/context", "reserveTokens", {}),
    ("post", "/api/v1/sessions/{id}/context", "maxTokens", {}),
    ("post", "/api/v1/sessions/{id}/context", "reserveTokens", {}),
    ("get", "/api/v1/sessions/{id}/search", "limit", {"q": "turn"}),
    ("get", "/api/v1/search", "limit", {"q": "turn"}),
    ("get", "/api/v1/sessions/{id}/compactions", "page", {}),
    ("get", "/api/v1/sessions/{id}/compactions", "pageSize", {}),
]


@pytest.fixture
def session_id(alice_api):
    session_id = create_session(alice_api)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=2))
    return session_id


@pytest.mark.parametrize(("method", "path", "name", "others"), ENDPOINTS)
def test_it_refuses_an_empty_or_malformed_numeric_parameter(
    alice_api, session_id, method, path, name, others
):
    for raw in MALFORMED:
        url = path.format(id=session_id)
        query = {**others, name: raw}
        if method == "get":
            response = alice_api.get(url, query)
        else:
            response = alice_api.post(f"{url}?{urlencode(query)}")
        assert response.status_code == 400, (url, name, repr(raw), response.content)
        body = response.json()
        assert body["error"] == "invalid_parameter", body
        assert name in body["detail"] and name in body.get("fields", {}), body
