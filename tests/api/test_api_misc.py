"""Token counting, the model list, the OpenAPI schema and docs, throttling."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from rest_framework.test import APIClient

from sessions_app import tokens

COUNT = "/api/v1/tokens/count"


def n(encoding: str, text: str) -> int:
    return len(tokens.load_encoding(encoding).encode(text, disallowed_special=()))


@pytest.mark.parametrize(
    ("body", "encoding", "exact"),
    [
        ({"model": "gpt-4o"}, "o200k_base", True),
        ({"model": "gpt-4"}, "cl100k_base", True),
        ({"model": "claude-3.5-sonnet"}, "cl100k_base", False),
        ({"encoding": "cl100k_base"}, "cl100k_base", True),
        ({"encoding": "o200k_base"}, "o200k_base", True),
    ],
)
def test_it_counts_text(alice_api, body, encoding, exact):
    text = "Hello, world! def f(x): return {'a': [1, 2]}  日本語 🚀"
    response = alice_api.post(COUNT, {**body, "text": text}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"tokens": n(encoding, text), "encoding": encoding, "exact": exact}


def test_it_counts_special_token_text_as_plain_text(alice_api):
    text = "before <|endoftext|> after <|endofprompt|>"
    body = alice_api.post(COUNT, {"model": "gpt-4o", "text": text}, format="json").json()
    assert body["tokens"] == n("o200k_base", text)
    # As text, the marker is several tokens, not the single special token.
    assert n("o200k_base", "<|endoftext|>") > 1
    assert alice_api.post(
        COUNT, {"model": "gpt-4o", "text": "<|endoftext|>"}, format="json"
    ).json()["tokens"] == n("o200k_base", "<|endoftext|>")


def test_it_counts_messages_with_the_chat_overhead(alice_api):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?", "name": "alice"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:..."}}]},
    ]
    body = alice_api.post(COUNT, {"model": "gpt-4o", "messages": messages}, format="json").json()
    structured = json.dumps(messages[3]["content"], ensure_ascii=False, separators=(",", ":"))
    expected = (
        (3 + n("o200k_base", "system") + n("o200k_base", "Be brief."))
        + (3 + n("o200k_base", "user") + n("o200k_base", "What is 2+2?") + n("o200k_base", "alice"))
        + (3 + n("o200k_base", "assistant"))
        + (3 + n("o200k_base", "user") + -(-len(structured) // 4))
        + 3
    )
    assert body == {"tokens": expected, "encoding": "o200k_base", "exact": True}


def test_it_counts_no_messages_as_zero(alice_api):
    assert (
        alice_api.post(COUNT, {"model": "gpt-4o", "messages": []}, format="json").json()["tokens"]
        == 0
    )


def test_it_lists_the_seed_models(alice_api):
    response = alice_api.get("/api/v1/models")
    assert response.status_code == 200
    models = {m["model"]: m for m in response.json()}
    assert models["gpt-4o"] == {
        "model": "gpt-4o",
        "contextLimit": 128_000,
        "encoding": "o200k_base",
    }
    assert models["claude-3.5-sonnet"]["contextLimit"] == 200_000
    assert models["claude-3.5-sonnet"]["encoding"] == "cl100k_base"
    assert models["gemini-3-pro"]["contextLimit"] == 1_000_000
    assert all(
        isinstance(m["contextLimit"], int) and m["contextLimit"] > 0 for m in models.values()
    )


def test_it_serves_an_openapi_3_schema(alice_api):
    response = alice_api.get("/api/v1/schema/")
    assert response.status_code == 200
    content = b"".join(response.streaming_content) if response.streaming else response.content
    schema = yaml.safe_load(content)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Context Ledger API"
    paths = schema["paths"]
    for path in (
        "/api/v1/sessions",
        "/api/v1/sessions/{session_id}",
        "/api/v1/sessions/{session_id}/events",
        "/api/v1/sessions/{session_id}/usage",
        "/api/v1/sessions/{session_id}/context",
        "/api/v1/tokens/count",
        "/api/v1/models",
    ):
        assert path in paths, path
    json_schema = alice_api.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert json.loads(json_schema.content)["openapi"].startswith("3.")


def test_it_serves_offline_docs(alice):
    client = APIClient()
    client.force_login(alice)
    response = client.get("/api/v1/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger" in html.lower()
    # The page's script is a file of its own (the Content-Security-Policy allows no inline
    # script): it points Swagger UI at the schema.
    script = client.get("/api/v1/docs/?script=").content.decode()
    assert "/api/v1/schema/" in script
    assets = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    assert assets
    assert not [a for a in assets if a.startswith(("http:", "https:", "//"))], assets
    assert "cdn" not in html.lower()
    static = [a for a in assets if a.startswith("/static/")]
    assert any("swagger-ui" in a for a in static)


def test_it_throttles_per_user(alice_api, bob_api, settings):
    settings.API_THROTTLE_RATE = "3/min"
    for _ in range(3):
        assert alice_api.get("/api/v1/models").status_code == 200
    response = alice_api.get("/api/v1/models")
    assert response.status_code == 429
    body = response.json()
    assert body["error"] == "throttled"
    assert body["detail"]
    assert isinstance(body["retryAfter"], int) and 0 < body["retryAfter"] <= 60
    assert response["Retry-After"]
    # Another user has a budget of their own.
    assert bob_api.get("/api/v1/models").status_code == 200


def test_it_can_turn_throttling_off(alice_api, settings):
    settings.API_THROTTLE_RATE = "off"
    for _ in range(10):
        assert alice_api.get("/api/v1/models").status_code == 200


def test_it_rejects_unknown_methods_in_the_error_format(alice_api):
    response = alice_api.put("/api/v1/models", {}, format="json")
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"
