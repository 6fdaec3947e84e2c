"""A gateway conversation that compacts, through the official OpenAI SDK and the provider
stand-in: the calls whose stories the call tests read."""

from __future__ import annotations

from typing import Any

from compaction_app.gateway import after
from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Call, Session
from sessions_app.services import session_update
from tests.support.gateway_live import openai_client, token_for

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def converse(client: Any, history: list[dict[str, Any]], turns: int, words: str) -> None:
    for turn in range(turns):
        history.append({"role": "user", "content": f"{words} {turn}. " * 30})
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})


def compacting_conversation(
    gateway_url: str, upstream: Any, user: Any, key: str, *, orm: Any = None
) -> tuple[list[dict[str, Any]], list[Call]]:
    """Eight turns, then the window shrinks so the ninth call compacts: the history sent and
    the calls, oldest first. `orm` runs the ORM steps (a browser test's in_thread)."""
    run = orm or (lambda fn, *a, **k: fn(*a, **k))
    client = openai_client(gateway_url, key=token_for(user), session=key)
    history = [SYSTEM]
    converse(client, history, 8, "Please fix bug")
    run(_shrink, key)
    history.append({"role": "user", "content": "Status?"})
    upstream.script(Step(text="All good.", prompt_tokens=300, cache_read_tokens=100))
    client.chat.completions.create(model="gpt-4o", messages=history)
    return history, run(_calls, key)


def _shrink(key: str) -> None:
    after.wait_idle()
    session = Session.objects.get(client_key=key)
    session = session_update(session=session, settings={"autoCompact": False})
    session_update(session=session, context_limit=int(session.context_tokens / 0.85))


def _calls(key: str) -> list[Call]:
    after.wait_idle()
    return list(Call.objects.filter(session__client_key=key).order_by("started_at"))
