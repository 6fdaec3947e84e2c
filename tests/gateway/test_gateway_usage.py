"""Provider usage read per wire format into the reply's neutral figures (pure, no database)."""

import pytest

from compaction_app.gateway import usage
from compaction_app.gateway.providers import anthropic_messages, openai_chat, openai_responses

pytestmark = pytest.mark.profile_independent


def test_it_reads_openai_chat_cached_tokens():
    got = openai_chat.usage(
        {
            "prompt_tokens": 2000,
            "completion_tokens": 10,
            "total_tokens": 2010,
            "prompt_tokens_details": {"cached_tokens": 1024},
        }
    )
    assert got["prompt_tokens"] == 2000
    assert got["cached_input_tokens"] == 1024
    assert got["cache_write_tokens"] is None
    assert openai_chat.usage({})["cached_input_tokens"] is None
    assert openai_chat.usage({"prompt_tokens_details": None})["cached_input_tokens"] is None


def test_it_reads_openai_responses_cached_tokens():
    got = openai_responses.usage(
        {
            "input_tokens": 3000,
            "input_tokens_details": {"cached_tokens": 2048},
            "output_tokens": 5,
            "total_tokens": 3005,
        }
    )
    assert (got["prompt_tokens"], got["completion_tokens"], got["total_tokens"]) == (3000, 5, 3005)
    assert got["cached_input_tokens"] == 2048


def test_it_reads_anthropic_cache_reads_writes_and_the_one_hour_split():
    got = anthropic_messages.usage(
        {
            "input_tokens": 100,
            "cache_creation_input_tokens": 1500,
            "cache_read_input_tokens": 3000,
            "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 500},
            "output_tokens": 7,
        }
    )
    assert got["prompt_tokens"] == 4600  # everything the model read
    assert (got["cached_input_tokens"], got["cache_write_tokens"]) == (3000, 1500)
    assert got["cache_write_1h_tokens"] == 500
    assert got["total_tokens"] == 4607
    # Only the split given: the write is its sum.
    split_only = anthropic_messages.usage(
        {
            "input_tokens": 1,
            "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 5},
        }
    )
    assert split_only["cache_write_tokens"] == 15
    assert anthropic_messages.usage({})["prompt_tokens"] is None
    # An unreadable part makes the prompt unknown and is named; it used to count as 0.
    unreadable = anthropic_messages.usage({"input_tokens": True, "output_tokens": 4})
    assert unreadable["prompt_tokens"] is None and unreadable["completion_tokens"] == 4
    assert set(unreadable["usage_dropped"]) == {"promptTokens"}


@pytest.mark.parametrize(
    "raw",
    [
        {"input_tokens": -5, "output_tokens": 3},
        {"input_tokens": 10, "cache_read_input_tokens": 2.5, "output_tokens": 3},
        {"input_tokens": 10, "output_tokens": "3"},
        {"input_tokens": 10**19, "output_tokens": 10**25},
        {"input_tokens": 10**13, "output_tokens": 10**14},
    ],
)
def test_it_never_reads_an_impossible_anthropic_figure_as_zero(raw):
    """Issue 42, row 4: Anthropic's impossible figures became 0, with no usageDropped note."""
    from compaction_app.gateway.messages import ClientMessage, Reply

    message = ClientMessage(role="assistant", hash_text="x", tool_ids=(), drafts=())
    reply = Reply(message=message, model="claude", raw_usage=raw, **anthropic_messages.usage(raw))
    assert reply.usage_dropped, reply
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = getattr(reply, name)
        assert value is None or 0 < value <= usage.MAX_FIGURE, (name, value)
    assert reply.prompt_tokens != 0 and reply.completion_tokens != 0


def test_it_drops_impossible_usage_figures_per_field_and_says_why():
    figures = {
        "prompt_tokens": 100,
        "completion_tokens": 10**13,
        "total_tokens": 110,
        "cached_input_tokens": 80,
        "cache_write_tokens": 40,
        "cache_write_1h_tokens": 5,
    }
    kept, dropped = usage.bounded(figures)
    assert kept == {
        "prompt_tokens": 100,
        "completion_tokens": None,
        "total_tokens": 110,
        "cached_input_tokens": None,
        "cache_write_tokens": None,
        "cache_write_1h_tokens": None,
    }
    assert set(dropped) == {
        "completionTokens",
        "cachedInputTokens",
        "cacheWriteTokens",
        "cacheWrite1hTokens",
    }
    assert "out of range" in dropped["completionTokens"]
    sane = {**figures, "completion_tokens": 10, "cached_input_tokens": 50}
    assert usage.bounded(sane) == (sane, {})
    kept, dropped = usage.bounded({**sane, "cache_write_1h_tokens": 41})
    assert kept["cache_write_1h_tokens"] is None and kept["cache_write_tokens"] == 40
    assert list(dropped) == ["cacheWrite1hTokens"]
