"""What the OpenAI and Anthropic summarizers share, against a local server speaking each wire
format: which failures are transient (Celery retries) and which permanent, never the key in an
error, and long input split into pieces that carry the summary forward."""

from __future__ import annotations

import pytest

from compaction_app.summarizers.base import SummaryMessage
from compaction_app.summarizers.provider import ProviderSummarizer
from compaction_app.testkit.provider_standin import (
    ProviderStandIn,
    error,
    rate_limited,
    reply_text,
    server_error,
    slow,
    unauthorized,
)
from tests.support.helpers import closed_port, rough_token_count, summarizer_error
from tests.support.remote_summarizers import REMOTES, USER_TURN, Remote

pytestmark = pytest.mark.profile_independent

MESSAGES = [
    USER_TURN,
]


@pytest.fixture(params=sorted(REMOTES))
def remote(request: pytest.FixtureRequest) -> Remote:
    return REMOTES[request.param]


def summarize(summarizer: ProviderSummarizer) -> str:
    return summarizer.summarize(previous_summary="", messages=MESSAGES, max_tokens=200)


def test_it_treats_429_as_transient_and_reports_retry_after(
    remote: Remote, fake: ProviderStandIn
) -> None:
    fake.script(rate_limited(retry_after=7))

    failure = summarizer_error(lambda: summarize(remote.make(fake)))

    assert failure.permanent is False
    assert "429" in str(failure) and "retry after 7s" in str(failure)
    assert len(fake.requests) == 1  # the SDK does not retry: Celery does


def test_it_treats_500_as_transient(remote: Remote, fake: ProviderStandIn) -> None:
    fake.script(server_error(500))

    failure = summarizer_error(lambda: summarize(remote.make(fake)))

    assert failure.permanent is False


def test_it_treats_a_timeout_as_transient(remote: Remote, fake: ProviderStandIn) -> None:
    fake.script(slow(2.0))

    failure = summarizer_error(lambda: summarize(remote.make(fake, timeout_seconds=0.5)))

    assert failure.permanent is False
    assert "timed out" in str(failure)


def test_it_treats_a_refused_connection_as_transient(remote: Remote) -> None:
    port = closed_port()
    summarizer = remote.summarizer(
        count_tokens=rough_token_count,
        api_key=remote.api_key,
        base_url=f"http://127.0.0.1:{port}",
        model="m",
        timeout_seconds=1.0,
    )

    failure = summarizer_error(lambda: summarize(summarizer))

    assert failure.permanent is False


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_it_treats_a_rejected_request_as_permanent(
    remote: Remote, fake: ProviderStandIn, status: int
) -> None:
    fake.script(error(status, f"Incorrect API key provided: {remote.api_key}"))

    failure = summarizer_error(lambda: summarize(remote.make(fake)))

    assert failure.permanent is True
    assert str(status) in str(failure)
    assert remote.api_key not in str(failure)


def test_it_treats_401_as_permanent(remote: Remote, fake: ProviderStandIn) -> None:
    fake.script(unauthorized())

    failure = summarizer_error(lambda: summarize(remote.make(fake)))

    assert failure.permanent is True


def test_it_splits_large_input_into_pieces_carrying_the_summary_forward(
    remote: Remote, fake: ProviderStandIn
) -> None:
    # Each message costs 600 + 8 tokens; the budget (window - reserve, floor 1000) fits one.
    messages = [
        SummaryMessage(event_id=f"e{i}", type="AGENT_MESSAGE", role="assistant", content=c * 2400)
        for i, c in enumerate("abc", start=1)
    ]
    fake.script(reply_text("summary-one"), reply_text("summary-two"), reply_text("summary-three"))
    summarizer = remote.make(fake, input_window_tokens=1200)

    result = summarizer.summarize(previous_summary="", messages=messages, max_tokens=100)

    assert result == "summary-three"
    # The user turn is the last message (after OpenAI's inline system message).
    users = [request.body["messages"][-1]["content"] for request in fake.requests]
    assert len(users) == 3
    assert "a" * 2400 in users[0] and "b" * 2400 not in users[0]
    assert "summary-one" in users[1] and "b" * 2400 in users[1]
    assert "summary-two" in users[2] and "c" * 2400 in users[2]


def test_it_refuses_to_start_without_a_key_for_the_default_endpoint(remote: Remote) -> None:
    failure = summarizer_error(
        lambda: remote.summarizer(count_tokens=rough_token_count, api_key="", model=remote.model)
    )

    assert failure.permanent is True
