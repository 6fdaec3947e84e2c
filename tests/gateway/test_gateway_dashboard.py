"""What the gateway adds to usage and the dashboard: count drift, the serving model, the
CONTEXT_COMPRESSED notice, and gateway-created sessions pushed to the sessions list."""

from __future__ import annotations

from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from compaction_app.dashboard.render import session_frame
from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Session
from tests.support.gateway_live import openai_client, token_for
from tests.support.helpers import ws_communicator

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_reports_count_drift_in_usage_and_on_the_session_page(gateway_url, upstream, alice):
    upstream.script(Step(prompt_tokens=55))
    client = openai_client(gateway_url, key=token_for(alice), session="drift")
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    )
    ours = int(raw.headers["X-Ledger-Context-Tokens"])
    session = Session.objects.get(client_key="drift")
    api = Client(HTTP_AUTHORIZATION=f"Token {token_for(alice)}")
    usage = api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    assert usage["lastProviderPromptTokens"] == 55
    assert usage["countDriftPercent"] == round(100 * (55 - ours) / ours, 1)
    reply = session.events.get(type="AGENT_MESSAGE")
    assert reply.metadata["forwardedTokens"] == ours
    assert reply.metadata["providerPromptTokens"] == 55

    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/sessions/{session.pk}/").content.decode()
    assert '<span id="serving-model">gpt-4o</span>' in page
    assert f'<span id="count-drift">{usage["countDriftPercent"]}</span>' in page


def test_it_shows_context_compressed_as_a_notice(alice):
    from sessions_app.services import session_create

    session = session_create(owner=alice, model="gpt-4o")
    html = session_frame(
        session=session,
        user=alice,
        message={
            "type": "CONTEXT_COMPRESSED",
            "sessionId": str(session.pk),
            "originalTokenCount": 9000,
            "compressedTokenCount": 1200,
        },
    )
    assert 'id="notice"' in html
    assert "Context compressed for the model: 9,000 → 1,200 tokens" in html


def test_it_pushes_a_gateway_created_session_to_the_sessions_list(gateway_url, upstream, alice):
    key = token_for(alice)

    async def scenario() -> str:
        socket = ws_communicator("/ws/dashboard/sessions/", token=key)
        connected, _ = await socket.connect()
        assert connected
        client = openai_client(gateway_url, key=key, session="live-new")
        await sync_to_async(client.chat.completions.create, thread_sensitive=False)(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
        frame = await socket.receive_from(timeout=10)
        await socket.disconnect()
        return frame

    frame = async_to_sync(scenario)()
    session = Session.objects.get(client_key="live-new")
    assert f'id="row-{session.pk}"' in frame
    # The list page inserts rows it does not show yet.
    browser = Client()
    browser.force_login(alice)
    # (from a static file: the Content-Security-Policy allows no inline script)
    assert "js/sessions.js" in browser.get("/").content.decode()
    script = Path(__file__).resolve().parents[2] / "static" / "js" / "sessions.js"
    assert "htmx:oobErrorNoTarget" in script.read_text()
