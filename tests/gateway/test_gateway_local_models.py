"""Local models through the gateway (Ollama, vLLM): a model the registry does not know gets
its window from the call (X-Ledger-Context-Limit) or from the server's default
(LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT); with neither, the refusal says what to set. Real HTTP
through the live server to the provider stand-in, with the official openai SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from sessions_app.models import Event, Session
from tests.support.gateway_live import openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

LOCAL = "llama3.1:8b"
CHAT = "/gateway/openai/v1/chat/completions"
HISTORY = [
    {"role": "system", "content": "You are a terse coding agent."},
    {"role": "user", "content": "List the files."},
]


def test_it_refuses_an_unknown_model_naming_what_to_set(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="ollama")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=LOCAL, messages=HISTORY)
    error = caught.value.body
    assert error["code"] == "unknown_model" and error["param"] == "model"
    for remedy in (
        "X-Ledger-Context-Limit",
        "LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT",
        "MODEL_CONTEXT_OVERRIDES",
    ):
        assert remedy in error["message"]
    assert not Session.objects.exists()
    assert upstream.requests == []


def test_it_takes_the_window_of_a_local_model_from_the_call(gateway_url, upstream, alice):
    client = openai_client(
        gateway_url, key=token_for(alice), session="ollama", **{"X-Ledger-Context-Limit": "8192"}
    )
    raw = client.chat.completions.with_raw_response.create(model=LOCAL, messages=HISTORY)
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert upstream.requests[-1].body["model"] == LOCAL
    session = Session.objects.get(client_key="ollama")
    assert (session.model, session.context_limit) == (LOCAL, 8192)
    used = int(raw.headers["X-Ledger-Context-Tokens"])
    assert float(raw.headers["X-Ledger-Percent-Used"]) == pytest.approx(100 * used / 8192, abs=0.1)
    types = list(Event.objects.filter(session=session).values_list("type", flat=True))
    assert types == ["SYSTEM_PROMPT", "USER_MESSAGE", "AGENT_MESSAGE"]


def test_it_streams_a_local_model_with_the_window_from_the_call(gateway_url, upstream, alice):
    client = openai_client(
        gateway_url, key=token_for(alice), session="vllm", **{"X-Ledger-Context-Limit": "32768"}
    )
    chunks = client.chat.completions.create(model="Qwen/Qwen3-8B", messages=HISTORY, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert Session.objects.get(client_key="vllm").context_limit == 32768


def test_it_gives_unknown_models_the_servers_default_window(gateway_url, upstream, alice, settings):
    settings.LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT = 16_384
    key = token_for(alice)
    openai_client(gateway_url, key=key, session="local").chat.completions.create(
        model=LOCAL, messages=HISTORY
    )
    # A model the registry knows keeps its own window; the call's header beats the default.
    openai_client(gateway_url, key=key, session="known").chat.completions.create(
        model="gpt-4o", messages=HISTORY
    )
    openai_client(
        gateway_url, key=key, session="told", **{"X-Ledger-Context-Limit": "4096"}
    ).chat.completions.create(model=LOCAL, messages=HISTORY)
    limits = dict(Session.objects.values_list("client_key", "context_limit"))
    assert limits == {"local": 16_384, "known": 128_000, "told": 4096}


def test_it_follows_the_window_a_later_call_states(gateway_url, upstream, alice):
    key = token_for(alice)
    for window in ("8192", "8192", "4096"):
        openai_client(
            gateway_url, key=key, session="ollama", **{"X-Ledger-Context-Limit": window}
        ).chat.completions.create(model=LOCAL, messages=HISTORY)
    assert Session.objects.get(client_key="ollama").context_limit == 4096
    # A call without the header leaves the session's window as it is.
    openai_client(gateway_url, key=key, session="ollama").chat.completions.create(
        model=LOCAL, messages=HISTORY
    )
    assert Session.objects.get(client_key="ollama").context_limit == 4096


@pytest.mark.parametrize(
    "value", ["0", "-1", "8k", "1e4", "4096.0", "", "100000001", "٣", "１２８", str(10**20)]
)
def test_it_refuses_a_bad_window_and_stores_nothing(gateway_url, upstream, alice, value):
    response = httpx.post(
        gateway_url + CHAT,
        json={"model": LOCAL, "messages": HISTORY},
        headers={
            "X-Ledger-Key": token_for(alice),
            "X-Ledger-Session": "bad",
            "X-Ledger-Context-Limit": value.encode(),
        },
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_context_limit"
    assert error["param"] == "X-Ledger-Context-Limit"
    assert not Session.objects.exists() and not Event.objects.exists()
    assert upstream.requests == []
