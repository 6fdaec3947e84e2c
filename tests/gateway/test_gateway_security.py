"""The provider credential a client sends through the gateway is forwarded and nowhere else:
not in the database, the logs, the API or the dashboard."""

from __future__ import annotations

import logging

import anthropic
import openai
import pytest
from django.apps import apps
from django.core import serializers
from django.test import Client

from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Session
from tests.support.gateway_live import CANARY, anthropic_client, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_never_stores_logs_or_shows_the_provider_key(gateway_url, upstream, alice, caplog):
    caplog.set_level(logging.DEBUG)
    key = token_for(alice)
    chat = openai_client(gateway_url, key=key, session="canary")
    claude = anthropic_client(gateway_url, key=key, session="canary-claude")
    upstream.script(Step(kind="error", status=500), Step(kind="error", status=401))
    with pytest.raises(openai.InternalServerError):
        chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "a"}])
    with pytest.raises(openai.AuthenticationError):
        chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "b"}])
    chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "c"}])
    for _ in chat.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "d"}], stream=True
    ):
        pass
    claude.messages.create(
        model="claude-3.5-sonnet", max_tokens=5, messages=[{"role": "user", "content": "e"}]
    )
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(gateway_url, key="bad", session="x").messages.create(
            model="claude-3.5-sonnet", max_tokens=5, messages=[{"role": "user", "content": "f"}]
        )
    # It did travel upstream.
    assert any(CANARY in str(r.headers) for r in upstream.requests)

    # Database: every row of every table.
    dump = "".join(
        serializers.serialize("json", model.objects.all()) for model in apps.get_models()
    )
    assert "canary" in dump  # the client keys are there, so the dump is real
    assert CANARY not in dump
    # Logs of this process (the server runs in it).
    for record in caplog.records:
        assert CANARY not in record.getMessage()
        assert CANARY not in str(record.__dict__)
    # API and dashboard.
    session = Session.objects.get(client_key="canary")
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    for path in (
        f"/api/v1/sessions/{session.pk}",
        f"/api/v1/sessions/{session.pk}/events?includeCompacted=true",
        f"/api/v1/sessions/{session.pk}/usage",
        "/api/v1/sessions",
    ):
        response = api.get(path)
        assert response.status_code == 200
        assert CANARY not in response.content.decode()
    browser = Client()
    browser.force_login(alice)
    for path in ("/", f"/sessions/{session.pk}/", f"/sessions/{session.pk}/?all=1"):
        response = browser.get(path)
        assert response.status_code == 200
        assert CANARY not in response.content.decode()
