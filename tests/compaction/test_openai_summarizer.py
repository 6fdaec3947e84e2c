"""OpenAISummarizer against a local server speaking the OpenAI chat-completions wire format."""

from __future__ import annotations

import pytest

from compaction_app.summarizers.base import SummaryMessage, summarizer_class
from compaction_app.summarizers.openai_summarizer import OpenAISummarizer
from compaction_app.testkit.provider_standin import (
    ProviderStandIn,
    error,
    invalid_json,
    missing_fields,
    raw_json,
    reply_text,
)
from tests.support.helpers import summarizer_error
from tests.support.remote_summarizers import REMOTES, USER_TURN

pytestmark = pytest.mark.profile_independent

REMOTE = REMOTES["openai"]
API_KEY = REMOTE.api_key


MESSAGES = [
    USER_TURN,
    SummaryMessage(
        event_id="e2",
        type="TOOL_CALL",
        role="assistant",
        content='{"path": "src/app.py"}',
        name="read_file",
    ),
]


def summarize(summarizer: OpenAISummarizer, previous: str = "") -> str:
    return summarizer.summarize(previous_summary=previous, messages=MESSAGES, max_tokens=200)


def test_it_is_registered_as_openai() -> None:
    assert summarizer_class("openai") is OpenAISummarizer


def test_it_returns_the_stripped_summary_and_sends_model_max_tokens_and_messages(
    fake: ProviderStandIn,
) -> None:
    fake.script(reply_text("\n  ## Status\n- bug #42 open  \n"))

    result = summarize(REMOTE.make(fake), previous="## Status\n- earlier work on ticket 7")

    assert result == "## Status\n- bug #42 open"
    [request] = fake.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.body["model"] == "gpt-4o-mini"
    assert request.body["max_tokens"] == 200
    system, user = request.body["messages"]
    assert system["role"] == "system" and "Request and intent" in system["content"]
    assert user["role"] == "user"
    assert "earlier work on ticket 7" in user["content"]
    assert "Fix bug #42 in src/app.py" in user["content"]
    assert "TOOL_CALL (assistant, name=read_file)" in user["content"]


@pytest.mark.parametrize(
    "behaviour",
    [
        invalid_json(),
        missing_fields(),
        raw_json({"id": "x", "object": "chat.completion", "choices": []}),
        raw_json(
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": None}}],
            }
        ),
        raw_json(
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "   "}}],
            }
        ),
        raw_json(
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": 42}}],
            }
        ),
    ],
    ids=["invalid-json", "missing-fields", "no-choices", "null-content", "blank", "non-string"],
)
def test_it_treats_a_malformed_body_as_permanent(fake: ProviderStandIn, behaviour: object) -> None:
    fake.script(behaviour)  # type: ignore[arg-type]

    failure = summarizer_error(lambda: summarize(REMOTE.make(fake)))

    assert failure.permanent is True
    assert "malformed" in str(failure)


def test_it_falls_back_to_max_completion_tokens_when_the_model_asks_for_it(
    fake: ProviderStandIn,
) -> None:
    fake.script(
        error(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
        ),
        reply_text("done"),
    )

    assert summarize(REMOTE.make(fake)) == "done"
    first, second = fake.requests
    assert first.body["max_tokens"] == 200
    assert "max_tokens" not in second.body and second.body["max_completion_tokens"] == 200


def test_it_accepts_a_keyless_local_server(fake: ProviderStandIn) -> None:
    fake.script(reply_text("local ok"))

    assert summarize(REMOTE.make(fake, api_key="")) == "local ok"
