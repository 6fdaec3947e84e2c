"""AnthropicSummarizer against a local server speaking the Anthropic messages wire format."""

from __future__ import annotations

import pytest

from compaction_app.summarizers.anthropic_summarizer import AnthropicSummarizer
from compaction_app.summarizers.base import SummaryMessage, summarizer_class
from compaction_app.testkit.provider_standin import (
    ProviderStandIn,
    invalid_json,
    missing_fields,
    overloaded,
    raw_json,
    reply_text,
)
from tests.support.helpers import summarizer_error
from tests.support.remote_summarizers import REMOTES, USER_TURN

pytestmark = pytest.mark.profile_independent

REMOTE = REMOTES["anthropic"]
API_KEY = REMOTE.api_key


MESSAGES = [
    USER_TURN,
    SummaryMessage(
        event_id="e2",
        type="TOOL_RESULT",
        role="tool",
        content="Traceback: KeyError 'user_id' at src/app.py:88",
        name="run_tests",
    ),
]


def summarize(summarizer: AnthropicSummarizer, previous: str = "") -> str:
    return summarizer.summarize(previous_summary=previous, messages=MESSAGES, max_tokens=200)


def message_body(content: object, stop_reason: str = "end_turn") -> dict[str, object]:
    return {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def test_it_is_registered_as_anthropic() -> None:
    assert summarizer_class("anthropic") is AnthropicSummarizer


def test_it_returns_the_stripped_summary_and_sends_model_max_tokens_system_and_messages(
    fake: ProviderStandIn,
) -> None:
    fake.script(reply_text("\n  ## Status\n- KeyError at src/app.py:88  \n"))

    result = summarize(REMOTE.make(fake), previous="## Status\n- earlier work on ticket 7")

    assert result == "## Status\n- KeyError at src/app.py:88"
    [request] = fake.requests
    assert request.path == "/v1/messages"
    # Older SDKs send x-api-key, newer ones a bearer token: either carries the key.
    assert API_KEY in (
        request.headers.get("x-api-key"),
        request.headers.get("authorization", "")[7:],
    )
    assert request.headers["anthropic-version"]
    assert request.body["model"] == "claude-3-5-sonnet-latest"
    assert request.body["max_tokens"] == 200
    assert "Request and intent" in request.body["system"]
    [user] = request.body["messages"]
    assert user["role"] == "user"
    assert "earlier work on ticket 7" in user["content"]
    assert "Fix bug #42 in src/app.py" in user["content"]
    assert "TOOL_RESULT (tool, name=run_tests)" in user["content"]
    assert "KeyError 'user_id'" in user["content"]


def test_it_joins_the_text_blocks_and_skips_other_blocks(fake: ProviderStandIn) -> None:
    fake.script(
        raw_json(
            message_body(
                [
                    {"type": "thinking", "thinking": "secret reasoning", "signature": "s"},
                    {"type": "text", "text": "## Status\n"},
                    {"type": "text", "text": "- done"},
                ]
            )
        )
    )

    assert summarize(REMOTE.make(fake)) == "## Status\n- done"


def test_it_treats_529_overloaded_as_transient(fake: ProviderStandIn) -> None:
    fake.script(overloaded())

    failure = summarizer_error(lambda: summarize(REMOTE.make(fake)))

    assert failure.permanent is False
    assert "529" in str(failure)


@pytest.mark.parametrize(
    "behaviour",
    [
        invalid_json(),
        missing_fields(),
        raw_json(message_body([])),
        raw_json(message_body(None)),
        raw_json(message_body([{"type": "text", "text": "   "}])),
        raw_json(message_body([{"type": "tool_use", "id": "t", "name": "x", "input": {}}])),
    ],
    ids=["invalid-json", "missing-fields", "no-blocks", "null-content", "blank", "no-text-block"],
)
def test_it_treats_a_malformed_body_as_permanent(fake: ProviderStandIn, behaviour: object) -> None:
    fake.script(behaviour)  # type: ignore[arg-type]

    failure = summarizer_error(lambda: summarize(REMOTE.make(fake)))

    assert failure.permanent is True
    assert "malformed" in str(failure)


def test_it_treats_a_refusal_as_permanent(fake: ProviderStandIn) -> None:
    fake.script(raw_json(message_body([{"type": "text", "text": "I can't help."}], "refusal")))

    failure = summarizer_error(lambda: summarize(REMOTE.make(fake)))

    assert failure.permanent is True
