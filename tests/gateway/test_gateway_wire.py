"""The gateway's pure parts, without a database: message <-> event conversion for both wire
formats, the stable message hash, stream accumulators and the fit decision."""

from __future__ import annotations

import json

import pytest

from compaction_app.fitting import passes_through
from compaction_app.gateway import providers, wire
from compaction_app.gateway.messages import (
    GatewayInputError,
    chain_hash,
    event_id,
    message_hash,
)
from compaction_app.gateway.providers import anthropic_messages as anthropic
from compaction_app.gateway.providers import openai_chat as openai
from compaction_app.policy import Policy

pytestmark = pytest.mark.profile_independent


def test_it_hashes_role_content_and_tool_ids_stably():
    base = message_hash("user", "hi", ())
    assert base == message_hash("user", "hi", ())
    assert len(base) == 32
    assert base != message_hash("assistant", "hi", ())
    assert base != message_hash("user", "hi ", ())
    assert message_hash("tool", "x", ("a",)) != message_hash("tool", "x", ("b",))
    chain = chain_hash("", base)
    assert event_id("s", chain, 0) == event_id("s", chain, 0)
    assert event_id("s", chain, 0) != event_id("s", chain, 1)
    # The same message after another history is another event.
    assert chain_hash(chain, base) != chain_hash(
        chain_hash("", message_hash("user", "x", ())), base
    )


def test_it_identifies_an_assistant_turn_however_the_sdk_resends_it():
    sent = openai.to_client_message(
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        }
    )
    reply = openai.reply_from_response(
        {
            "model": "gpt-4o",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "ls", "arguments": "{}"},
                            }
                        ],
                    }
                }
            ],
        },
        model="gpt-4o",
    )
    assert reply is not None and reply.message.hash == sent.hash
    assert [d.type for d in sent.drafts] == ["TOOL_CALL"]


def test_it_converts_openai_messages_to_events():
    system = openai.to_client_message({"role": "developer", "content": "be terse"})
    assert [(d.type, d.content) for d in system.drafts] == [("SYSTEM_PROMPT", "be terse")]
    parts = openai.to_client_message(
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    )
    assert parts.drafts[0].content == "a\nb"  # all text: stored as text, counted exactly
    image = openai.to_client_message(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "u"}},
            ],
        }
    )
    assert isinstance(image.drafts[0].content, list)  # non-text: the parts, by the non-text rule
    tool = openai.to_client_message({"role": "tool", "tool_call_id": "c1", "content": "out"})
    assert (tool.drafts[0].type, tool.drafts[0].tool_call_id) == ("TOOL_RESULT", "c1")
    with pytest.raises(GatewayInputError):
        openai.to_client_message({"role": "user", "content": {"x": 1}})


def test_it_converts_anthropic_messages_to_events():
    units = anthropic.parse_request(
        {
            "model": "claude-3.5-sonnet",
            "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "let me look"},
                        {"type": "tool_use", "id": "t1", "name": "ls", "input": {"d": "."}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "a.py"}],
                        },
                        {"type": "text", "text": "and?"},
                    ],
                },
            ],
        }
    )[1]
    converted = [anthropic.to_client_message(unit, i) for i, unit in enumerate(units)]
    assert [[d.type for d in m.drafts] for m in converted] == [
        ["SYSTEM_PROMPT"],
        ["USER_MESSAGE"],
        ["AGENT_MESSAGE", "TOOL_CALL"],
        ["TOOL_RESULT", "USER_MESSAGE"],
    ]
    assert json.loads(converted[2].drafts[1].content) == {"d": "."}
    assert converted[3].drafts[0].content == "a.py"
    assert converted[3].tool_ids == ("t1",)


def test_it_maps_anthropic_usage_including_cache_tokens():
    reply = anthropic.reply_from_response(
        {
            "model": "claude-3.5-sonnet",
            "content": [{"type": "text", "text": "hi"}],
            "usage": {
                "input_tokens": 10,
                "cache_creation_input_tokens": 20,
                "cache_read_input_tokens": 30,
                "output_tokens": 5,
            },
        },
        model="x",
    )
    assert reply is not None
    assert (reply.prompt_tokens, reply.completion_tokens, reply.total_tokens) == (60, 5, 65)


def test_it_rebuilds_a_streamed_openai_reply_from_split_chunks():
    accumulator = openai.StreamAccumulator("gpt-4o")
    stream = (
        b'data: {"model":"gpt-4o-2024","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"lo","tool_calls":[{"index":0,"id":"c","function":{"name":"ls","arguments":"{\\"a\\""}}]}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n'
        b"data: [DONE]\n\n"
    )
    for start in range(0, len(stream), 7):  # arbitrary network chunking
        accumulator.feed(stream[start : start + 7])
    reply = accumulator.reply()
    assert accumulator.done and reply is not None
    assert reply.model == "gpt-4o-2024"
    assert reply.message.drafts[0].content == "Hello"
    assert reply.message.drafts[1].content == '{"a":1}'
    assert reply.prompt_tokens == 7


def test_it_decides_pass_through_only_below_the_threshold_of_an_uncompacted_session():
    policy = Policy(compact_threshold=0.8, hard_threshold=0.95, fit_target_ratio=0.5)
    common = {"window": 1000, "policy": policy}
    assert passes_through(tokens=799, compacted=False, **common)
    assert not passes_through(tokens=799, compacted=True, **common)
    assert not passes_through(tokens=800, compacted=False, **common)
    assert not passes_through(tokens=990, compacted=False, **common)


def test_it_shapes_errors_like_each_provider():
    body = openai.error_body(
        "too long", status=400, code="context_length_exceeded", param="messages", limit=5
    )
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "context_length_exceeded" and body["error"]["limit"] == 5
    body = anthropic.error_body("nope", status=401)
    assert body == {"type": "error", "error": {"type": "authentication_error", "message": "nope"}}


def test_it_renders_a_fitted_request_in_the_clients_own_shape():
    from compaction_app.gateway import shape

    units = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "old"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "r"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "long output"},
        {"role": "user", "content": "new", "name": "me"},
    ]
    body = {"model": "m", "messages": units, "temperature": 0}
    plan = shape.Plan(kept=(0, 3, 4), summary="what happened", cleared={})
    out = openai.render_fitted(body, units, plan, "m2")
    # The result whose call was folded is left out; the kept turn is the client's own dict.
    assert out["messages"] == [
        units[0],
        {"role": "system", "content": shape.summary_text("what happened")},
        units[4],
    ]
    assert out["temperature"] == 0 and out["model"] == "m2"
    cleared = shape.Plan(kept=(0, 1, 2, 3, 4), summary=None, cleared={3: {"a": "[cleared]"}})
    out = openai.render_fitted(body, units, cleared, "m")
    assert out["messages"][2] is units[2]  # the words beside the call stay with it
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "a", "content": "[cleared]"}
    # Same inputs, same bytes.
    assert json.dumps(openai.render_fitted(body, units, plan, "m")) == json.dumps(
        openai.render_fitted(body, units, plan, "m")
    )


def test_it_keeps_anthropic_system_blocks_and_opens_with_a_user_turn():
    from compaction_app.gateway import shape

    system = [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}]
    messages = [
        {"role": "user", "content": "old"},
        {"role": "assistant", "content": [{"type": "text", "text": "answer"}]},
        {"role": "user", "content": "new"},
    ]
    body = {"model": "c", "system": system, "messages": messages}
    units = [{"role": "system", "content": system}, *messages]
    plan = shape.Plan(kept=(0, 2, 3), summary="earlier", cleared={})
    out = anthropic.render_fitted(body, units, plan, "c")
    assert out["system"][0] == system[0]
    assert out["system"][1]["cache_control"] == {"type": "ephemeral"}
    assert out["messages"] == [
        {"role": "user", "content": shape.RESUME_TEXT},
        messages[1],
        messages[2],
    ]
    assert body["system"] == system  # the client's body is not touched


def _events(*events: tuple[str | None, dict | str]) -> list[bytes]:
    """SSE events, each `event:` (when named) and `data:` line ended by CRLF, as some
    providers (Google's) frame them."""
    framed = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {name}\r\n" if name else ""
        framed.append(f"{head}data: {text}\r\n\r\n".encode())
    return framed


_CRLF_STREAMS = {
    "openai": _events(
        (None, {"model": "gpt-4o", "choices": [{"index": 0, "delta": {"content": "Hello "}}]}),
        (None, {"choices": [{"index": 0, "delta": {"content": "there"}}]}),
        (None, "[DONE]"),
    ),
    "responses": _events(
        ("response.created", {"type": "response.created", "response": {"model": "gpt-4o"}}),
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {
                    "model": "gpt-4o",
                    "output": [
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "Hello there"}],
                        }
                    ],
                    "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
                },
            },
        ),
    ),
    "anthropic": _events(
        ("message_start", {"type": "message_start", "message": {"model": "claude-x"}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hello "},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "there"},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ),
    "gemini": _events(
        (None, {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello "}]}}]}),
        (
            None,
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": [{"text": "there"}]},
                        "finishReason": "STOP",
                    }
                ]
            },
        ),
    ),
}


@pytest.mark.parametrize("wire", providers.PROVIDERS, ids=lambda wire: wire.NAME)
@pytest.mark.parametrize("size", [1, 3, 1 << 16])
def test_it_reads_a_crlf_framed_stream_on_every_wire(wire, size):
    """One SSE framer for every wire: CRLF line ends (and a CR and its LF in different
    pieces) read as LF."""
    data = b"".join(_CRLF_STREAMS[wire.NAME])
    accumulator = wire.stream_accumulator("m")
    for start in range(0, len(data), size):
        accumulator.feed(data[start : start + size])
    assert accumulator.done and not accumulator.errored
    reply = accumulator.reply()
    assert reply is not None
    assert reply.message.hash_text == "Hello there"


def test_the_framer_joins_data_lines_and_reads_lone_cr_line_ends():
    framer = wire.SSEFramer()
    assert framer.feed(b"event: x\rdata: a\rdata: b\r") == []
    assert framer.feed(b"\r: comment\n\ndata: c\n\n") == [b"a\nb", b"c"]


def test_the_framer_says_where_each_event_began_in_the_piece_fed():
    framer = wire.SSEFramer()
    piece = b"data: a\r\n\r\nevent: x\ndata: b\n\ndata: c"
    assert framer.feed_events(piece) == [(b"a", 0), (b"b", 11)]
    # An event begun in an earlier piece starts before this one.
    assert framer.feed_events(b"\r") == []
    assert framer.feed_events(b"\r\ndata: d\r\r") == [(b"c", -8)]
    # The trailing `\r` might have begun `\r\n`: "d" ends once the next piece says not.
    assert framer.feed_events(b"data: e") == [(b"d", -9)]


@pytest.mark.parametrize("name", ["openai", "responses", "anthropic", "gemini"])
def test_every_wires_reader_survives_any_json_shape(name):
    """Issue 42, row 1: any well-formed JSON of any shape, in any event: the reader says it
    could not read it (`malformed`, `cut`) and never raises."""
    from compaction_app.gateway.providers import PROVIDERS

    (found,) = [w for w in PROVIDERS if name == w.NAME]
    shapes = [5, "x", None, [], [5], {"a": 5}, True, 1.5]
    keys = [
        "choices",
        "delta",
        "message",
        "content_block",
        "item",
        "response",
        "candidates",
        "content",
        "parts",
        "usage",
        "usageMetadata",
        "index",
        "output_index",
        "type",
        "tool_calls",
        "function",
        "model",
        "modelVersion",
    ]
    for key in keys:
        for shape in shapes:
            accumulator = found.stream_accumulator("m")
            for event in (
                {key: shape},
                {"type": "message_start", key: shape},
                {"type": "content_block_delta", "index": 0, key: shape},
                {"choices": [{key: shape}]},
                {"choices": [{"delta": {key: shape}}]},
                {"candidates": [{key: shape}]},
            ):
                accumulator.feed(b"data: " + json.dumps(event).encode() + b"\n\n")
            accumulator.reply()  # may be None; never raises
