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


def test_it_bounds_reasoning_tokens_by_the_output_they_are_part_of():
    """Issue 41's reasoning tokens go through issue 42's one bound: above the output (or past
    the bound, or with the output unknown) they are dropped and named, never clamped or 0."""
    sane = {"prompt_tokens": 10, "completion_tokens": 50, "reasoning_tokens": 30}
    assert usage.bounded(sane) == (sane, {})
    kept, dropped = usage.bounded({**sane, "reasoning_tokens": 51})
    assert kept["reasoning_tokens"] is None and kept["completion_tokens"] == 50
    assert list(dropped) == ["reasoningTokens"] and "exceeds" in dropped["reasoningTokens"]
    kept, dropped = usage.bounded({**sane, "reasoning_tokens": 10**19})
    assert kept["reasoning_tokens"] is None and "out of range" in dropped["reasoningTokens"]
    kept, dropped = usage.bounded({**sane, "completion_tokens": 10**13})
    assert (kept["completion_tokens"], kept["reasoning_tokens"]) == (None, None)
    assert set(dropped) == {"completionTokens", "reasoningTokens"}


@pytest.mark.parametrize(
    ("details", "dropped"),
    [
        ({"reasoning_tokens": 10**19}, {"reasoningTokens"}),
        ({"reasoning_tokens": 900}, {"reasoningTokens"}),  # above completion_tokens (100)
        ({"reasoning_tokens": -1}, {"reasoningTokens"}),
        ({"reasoning_tokens": 1.5}, {"reasoningTokens"}),
    ],
)
def test_it_never_keeps_an_impossible_reasoning_figure(details, dropped):
    from compaction_app.gateway.messages import ClientMessage, Reply

    message = ClientMessage(role="assistant", hash_text="x", tool_ids=(), drafts=())
    chat = {"prompt_tokens": 10, "completion_tokens": 100, "total_tokens": 110}
    responses = {"input_tokens": 10, "output_tokens": 100, "total_tokens": 110}
    for raw, read in (
        ({**chat, "completion_tokens_details": details}, openai_chat.usage),
        ({**responses, "output_tokens_details": details}, openai_responses.usage),
    ):
        reply = Reply(message=message, model="gpt-5", raw_usage=raw, **read(raw))
        assert reply.reasoning_tokens is None and set(reply.usage_dropped) == dropped, raw
        assert reply.completion_tokens == 100


def _iteration(prompt: int, completion: int) -> dict:
    return {"type": "compaction", "input_tokens": prompt, "output_tokens": completion}


@pytest.mark.parametrize(
    "iterations",
    [
        [_iteration(10**19, 5)],  # past the bound: the whole's prompt is dropped too
        [_iteration(10**12, 5), _iteration(10**12, 5)],  # each within it, the sum is not
        [{"type": "compaction", "input_tokens": -3, "output_tokens": 5}],  # unreadable
    ],
)
def test_it_never_prices_an_impossible_compaction_iteration_apart(iterations):
    """Issue 41 prices Anthropic's compaction iterations one by one; a part past issue 42's
    bound (or parts whose sum is) would reach the bill around the bounded whole (a bigint
    overflow that loses the call's row). Such parts are dropped and named: the call is then
    priced as one request, on the figures that passed the bound."""
    from compaction_app.gateway.messages import ClientMessage, Reply
    from sessions_app.pricing import price_call

    message = ClientMessage(role="assistant", hash_text="x", tool_ids=(), drafts=())
    raw = {"input_tokens": 100, "output_tokens": 7, "iterations": iterations}
    reply = anthropic_messages.reply_from_response(
        {"content": [{"type": "text", "text": "hi"}], "usage": raw}, model="claude-sonnet-4-5"
    )
    assert reply is not None
    assert reply.priced_apart == ()
    assert reply.usage_dropped, reply
    for name in usage.usage_bounds.NAMES:
        value = getattr(reply, name)
        assert value is None or 0 <= value <= usage.MAX_FIGURE, (name, value)
    parts = usage.call_usages(reply.priced_apart)
    from sessions_app.pricing import CallUsage

    cost = price_call(
        reply.model,
        CallUsage(
            input_tokens=reply.prompt_tokens or 0, output_tokens=reply.completion_tokens or 0
        ),
        parts,
    )
    assert cost.nano_usd is not None and cost.nano_usd < 9 * 10**18
    # A sane iteration is kept, each priced apart (issue 41).
    fine = Reply(
        message=message,
        model="claude-sonnet-4-5",
        **anthropic_messages.usage({**raw, "iterations": [_iteration(1000, 20)]}),
        priced_apart=anthropic_messages.usage_parts({"iterations": [_iteration(1000, 20)]}),
    )
    assert len(fine.priced_apart) == 1 and not fine.usage_dropped
    assert (fine.prompt_tokens, fine.completion_tokens) == (1100, 27)
