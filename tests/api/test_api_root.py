"""GET /api/v1/: the API root a newcomer lands on (public: it lists links only)."""

from __future__ import annotations

from rest_framework.test import APIClient


def test_it_answers_the_api_root_with_links_to_the_endpoints_schema_and_docs(db):
    response = APIClient().get("/api/v1/")
    assert response.status_code == 200
    body = response.json()
    assert body["schema"] == "http://testserver/api/v1/schema/"
    assert body["docs"] == "http://testserver/api/v1/docs/"
    assert body["endpoints"]["sessions"] == "http://testserver/api/v1/sessions"
    assert body["endpoints"]["usage"] == "http://testserver/api/v1/sessions/{session_id}/usage"
    assert body["gateway"] == {
        "openai": "http://testserver/gateway/openai/v1",
        "anthropic": "http://testserver/gateway/anthropic",
        "gemini": "http://testserver/gateway/gemini",
    }


def test_it_lists_only_paths_the_schema_publishes(alice_api):
    schema = alice_api.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    paths = set(schema["paths"])
    body = APIClient().get("/api/v1/").json()
    for url in body["endpoints"].values():
        assert url.removeprefix("http://testserver") in paths, url
    assert "/api/v1/" in paths


def test_it_keeps_every_listed_endpoint_behind_authentication(db):
    assert APIClient().get("/api/v1/sessions").status_code == 401
