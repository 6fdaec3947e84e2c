"""Gemini's wire format, pure: parsing a generateContent body, what the ledger records and
identifies, the fitted request in the client's own shape, usage, errors and the SSE stream.
No database, no server."""

from __future__ import annotations

import json

import pytest

from compaction_app.gateway import providers, shape
from compaction_app.gateway.messages import GatewayInputError
from compaction_app.gateway.providers import gemini

pytestmark = pytest.mark.profile_independent

SIGNATURE = "CiQB0e2Kb7+sig/with+base64==" * 3
GENERATE = {"model": "gemini-2.5-pro", "version": "v1beta", "action": "generateContent"}
STREAM = {**GENERATE, "action": "streamGenerateContent"}


def a_tool_loop() -> dict:
    """Gemini CLI's shape of a tool loop: instructions, tools, a call with its signature and
    id, its response with the same id, then a new user question."""
    return {
        "systemInstruction": {"parts": [{"text": "You are an interactive CLI agent."}]},
        "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": {}}]}],
        "generationConfig": {"temperature": 0, "thinkingConfig": {"includeThoughts": True}},
        "contents": [
            {"role": "user", "parts": [{"text": "Read a.py"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Planning the read.", "thought": True},
                    {
                        "functionCall": {
                            "id": "call-1",
                            "name": "read_file",
                            "args": {"path": "a.py"},
                        },
                        "thoughtSignature": SIGNATURE,
                    },
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "id": "call-1",
                            "name": "read_file",
                            "response": {"output": "print(1)"},
                        }
                    }
                ],
            },
            {"role": "model", "parts": [{"text": "It prints 1."}]},
            {"role": "user", "parts": [{"text": "Now b.py"}]},
        ],
    }


def test_it_parses_units_from_the_instruction_and_contents_with_the_paths_model():
    parsed = gemini.parse_request(a_tool_loop(), GENERATE)
    assert parsed.model == "gemini-2.5-pro" and parsed.stream is False
    assert [unit["role"] for unit in parsed.units] == [
        "system",
        "user",
        "model",
        "user",
        "model",
        "user",
    ]
    assert gemini.parse_request(a_tool_loop(), STREAM).stream is True
    # The units hold the client's own objects: fitting forwards them as they came.
    body = a_tool_loop()
    assert gemini.parse_request(body, GENERATE).units[2]["content"] is body["contents"][1]


def test_it_reads_snake_case_as_camel_case():
    body = {
        "system_instruction": {"parts": [{"text": "rules"}]},
        "contents": [{"parts": [{"text": "hi"}]}],
        "cached_content": "cachedContents/abc",
    }
    parsed = gemini.parse_request(body, GENERATE)
    assert parsed.units[0] == {"role": "system", "content": body["system_instruction"]}
    assert parsed.units[1]["role"] == "user"  # the default role
    assert parsed.unfitted is True  # a cached prefix is Google's: forwarded as sent
    assert gemini.parse_request({"contents": body["contents"]}, GENERATE).unfitted is False


def test_it_counts_a_wrapped_generate_content_request():
    wrapped = {"generateContentRequest": {"model": "models/x", **a_tool_loop()}}
    parsed = gemini.parse_request(wrapped, {"model": "gemini-2.5-pro", "version": "v1"})
    assert len(parsed.units) == 6


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": ["hi"]}, "contents[0]"),
        ({"contents": [{"role": "user"}]}, "contents[0].parts"),
        ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": [{"parts": [{"text": 3}]}]}, "contents[0].parts[0].text"),
        ({"contents": [{"parts": [{"functionCall": {"args": {}}}]}]}, None),
    ],
)
def test_it_refuses_what_it_cannot_read(body, param):
    with pytest.raises(GatewayInputError) as refused:
        gemini.parse_request(body, GENERATE)
    if param is not None:
        assert refused.value.param == param


def test_it_refuses_a_path_without_a_model():
    with pytest.raises(GatewayInputError):
        gemini.parse_request({"contents": [{"parts": [{"text": "x"}]}]}, {"model": ""})


def test_it_records_calls_and_responses_by_their_ids_and_thoughts_apart():
    units = gemini.parse_request(a_tool_loop(), GENERATE).units
    call = gemini.to_client_message(units[2], 2)
    assert [d.type for d in call.drafts] == ["AGENT_MESSAGE", "TOOL_CALL"]
    assert call.drafts[1].tool_call_id == "call-1" and call.drafts[1].name == "read_file"
    assert json.loads(call.drafts[1].content) == {"path": "a.py"}
    # The thought is recorded (non-text rule), never part of the turn's identity; so is the
    # call's signature, on a stand-in for the call (its arguments are the TOOL_CALL's).
    assert call.drafts[0].content == [
        {"text": "Planning the read.", "thought": True},
        {"functionCall": {"id": "call-1", "name": "read_file"}, "thoughtSignature": SIGNATURE},
    ]
    assert call.hash_text == "" and call.tool_ids == ("call-1",)
    result = gemini.to_client_message(units[3], 3)
    assert [d.type for d in result.drafts] == ["TOOL_RESULT"]
    assert result.drafts[0].content == "print(1)" and result.drafts[0].tool_call_id == "call-1"
    system = gemini.to_client_message(units[0], 0)
    assert system.role == "system" and system.drafts[0].content.startswith("You are")


def test_it_identifies_a_model_turn_without_its_thoughts_signatures_or_text_pieces():
    with_all = {
        "role": "model",
        "content": {
            "role": "model",
            "parts": [
                {"text": "Thinking...", "thought": True},
                {"text": "It ", "thoughtSignature": SIGNATURE},
                {"text": "prints 1."},
            ],
        },
    }
    resent = {"role": "model", "content": {"role": "model", "parts": [{"text": "It prints 1."}]}}
    assert gemini.to_client_message(with_all).hash == gemini.to_client_message(resent).hash


def test_it_pairs_calls_without_ids_by_name_and_rank():
    call = {
        "role": "model",
        "content": {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "ls", "args": {"dir": "a"}}},
                {"functionCall": {"name": "ls", "args": {"dir": "b"}}},
            ],
        },
    }
    response = {
        "role": "user",
        "content": {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "ls", "response": {"output": "x"}}},
                {"functionResponse": {"name": "ls", "response": {"files": ["y"]}}},
            ],
        },
    }
    calls = [d.tool_call_id for d in gemini.to_client_message(call).drafts]
    results = [d.tool_call_id for d in gemini.to_client_message(response).drafts]
    assert calls == results == ["gemini:ls:0", "gemini:ls:1"]
    assert gemini.to_client_message(response).drafts[1].content == '{"files": ["y"]}'


def test_it_reads_a_reply_and_its_usage():
    payload = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {
                            "functionCall": {"name": "read_file", "args": {"path": "b.py"}},
                            "thoughtSignature": SIGNATURE,
                        }
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 1200,
            "cachedContentTokenCount": 1000,
            "candidatesTokenCount": 30,
            "thoughtsTokenCount": 70,
            "totalTokenCount": 1300,
        },
        "modelVersion": "gemini-2.5-pro-002",
    }
    reply = gemini.reply_from_response(payload, model="gemini-2.5-pro")
    assert reply is not None and reply.model == "gemini-2.5-pro-002"
    # The prompt includes what the cache served; thinking is output, reported apart.
    assert (reply.prompt_tokens, reply.cached_input_tokens) == (1200, 1000)
    assert (reply.completion_tokens, reply.total_tokens) == (100, 1300)
    assert reply.raw_usage["thoughtsTokenCount"] == 70
    assert [d.type for d in reply.message.drafts] == ["AGENT_MESSAGE", "TOOL_CALL"]
    assert reply.message.drafts[0].content[0]["thoughtSignature"] == SIGNATURE
    assert gemini.reply_from_response({"candidates": []}, model="m") is None
    assert (
        gemini.reply_from_response({"promptFeedback": {"blockReason": "SAFETY"}}, model="m") is None
    )


def test_it_reads_usage_without_every_figure():
    assert gemini.usage({})["prompt_tokens"] is None
    figures = gemini.usage({"promptTokenCount": 5, "candidatesTokenCount": 2})
    assert figures["completion_tokens"] == 2 and figures["total_tokens"] == 7
    assert figures["cached_input_tokens"] is None


def test_it_answers_errors_in_googles_shape():
    body = gemini.error_body(
        "contents must be a non-empty array", status=400, code="invalid_request", param="contents"
    )
    error = body["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert error["message"] == "contents must be a non-empty array"
    assert error["details"][0]["reason"] == "invalid_request"
    assert error["details"][0]["metadata"] == {"param": "contents"}
    assert gemini.error_body("no", status=401)["error"] == {
        "code": 401,
        "message": "no",
        "status": "UNAUTHENTICATED",
    }
    assert gemini.error_body("busy", status=429)["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert gemini.error_body("down", status=502)["error"]["status"] == "UNAVAILABLE"
    framed = gemini.stream_error("cut")
    assert framed.startswith(b"data: ") and framed.endswith(b"\n\n")
    assert json.loads(framed[6:])["error"]["status"] == "INTERNAL"


def test_it_builds_the_upstream_url_per_version_and_action():
    base = "https://generativelanguage.googleapis.com"
    assert (
        gemini.complete_url(base, model="gemini-2.5-pro", stream=False, params=GENERATE)
        == f"{base}/v1beta/models/gemini-2.5-pro:generateContent"
    )
    assert (
        gemini.complete_url(
            base, model="gemini-2.5-flash", stream=True, params={"version": "v1", "alt": "sse"}
        )
        == f"{base}/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    )
    assert gemini.complete_url(base, model="m", stream=True, params={}).endswith(
        "/v1beta/models/m:streamGenerateContent"
    )
    # A fallback model name cannot leave the models collection.
    assert "/../" not in gemini.complete_url(base, model="../x", stream=False, params=GENERATE)
    assert gemini.count_tokens_body(12) == {"totalTokens": 12}


def _stream(*chunks: dict, sep: bytes = b"\r\n\r\n") -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + sep for chunk in chunks)


STREAMED = (
    {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "Let me "}]}}],
        "modelVersion": "gemini-2.5-flash",
    },
    {"candidates": [{"content": {"role": "model", "parts": [{"text": "look."}]}}]},
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {
                            "functionCall": {"id": "c9", "name": "ls", "args": {"dir": "."}},
                            "thoughtSignature": SIGNATURE,
                        }
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {"promptTokenCount": 40, "candidatesTokenCount": 9, "totalTokenCount": 49},
    },
)


@pytest.mark.parametrize("size", [1, 2, 7, 10_000])
def test_it_rebuilds_a_streamed_reply_from_sse_chunks_without_done(size):
    data = _stream(*STREAMED)
    accumulator = gemini.stream_accumulator("gemini-2.5-flash")
    for start in range(0, len(data), size):
        accumulator.feed(data[start : start + size])
    assert accumulator.done and not accumulator.errored
    reply = accumulator.reply()
    assert reply is not None
    assert reply.message.drafts[0].content == [
        {"text": "Let me look."},
        {"functionCall": {"id": "c9", "name": "ls"}, "thoughtSignature": SIGNATURE},
    ]
    call = reply.message.drafts[1]
    assert (call.type, call.tool_call_id, call.name) == ("TOOL_CALL", "c9", "ls")
    assert reply.prompt_tokens == 40 and reply.completion_tokens == 9


def test_it_marks_a_stream_without_a_finish_reason_unfinished_and_an_error_errored():
    accumulator = gemini.stream_accumulator("m")
    accumulator.feed(_stream(*STREAMED[:2]))
    assert not accumulator.done
    accumulator.feed(gemini.stream_error("cut"))
    assert accumulator.errored


def _units(body: dict) -> list[dict]:
    return gemini.parse_request(body, GENERATE).units


def test_it_renders_a_fit_in_the_clients_own_shape_byte_for_byte():
    body = a_tool_loop()
    units = _units(body)
    # Nothing folded: the same objects, so the same bytes.
    unchanged = gemini.render_fitted(body, units, shape.Plan(tuple(range(6)), None, {}), "m")
    assert json.dumps(unchanged) == json.dumps(body)
    # The first exchange folded: the summary closes the instruction, the rest as sent.
    plan = shape.Plan(kept=(0, 4, 5), summary="read a.py: it prints 1", cleared={})
    out = gemini.render_fitted(body, units, plan, "m")
    assert out["systemInstruction"]["parts"] == [
        {"text": "You are an interactive CLI agent."},
        {"text": shape.summary_text("read a.py: it prints 1")},
    ]
    assert out["tools"] is body["tools"] and out["generationConfig"] is body["generationConfig"]
    assert "model" not in out  # the model is named in the URL
    # A conversation opening with the model's turn gets a user turn first.
    assert out["contents"][0] == {"role": "user", "parts": [{"text": shape.RESUME_TEXT}]}
    assert out["contents"][1:] == body["contents"][3:]


def test_it_keeps_the_call_its_signature_and_ids_and_clears_only_the_response_text():
    body = a_tool_loop()
    units = _units(body)
    plan = shape.Plan(kept=tuple(range(6)), summary=None, cleared={3: {"call-1": "[cleared]"}})
    out = gemini.render_fitted(body, units, plan, "m")
    assert out["contents"][1] is body["contents"][1]  # the call, its signature as sent
    assert out["contents"][2]["parts"][0]["functionResponse"] == {
        "id": "call-1",
        "name": "read_file",
        "response": {"output": "[cleared]"},
    }
    # A response whose call was folded is left out (the API refuses it alone).
    folded = gemini.render_fitted(body, units, shape.Plan((0, 1, 3, 4, 5), None, {}), "m")
    assert [c["role"] for c in folded["contents"]] == ["user", "model", "user"]


def test_it_turns_the_ledgers_render_into_contents():
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "system", "content": "Summary: earlier"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"functionCall": {"id": "c1", "name": "ls"}, "thoughtSignature": SIGNATURE}
            ],
            "tool_calls": [
                {"id": "c1", "function": {"name": "ls", "arguments": '{"dir": "."}'}},
                {"id": "gemini:ls:1", "function": {"name": "ls", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "gemini:ls:1", "content": "b.py"},
    ]
    body = {"system_instruction": {"parts": [{"text": "old"}]}, "contents": [], "tools": []}
    out = gemini.with_context(body, messages=messages, system=None, model="m")
    assert out["system_instruction"] == {"parts": [{"text": "rules"}, {"text": "Summary: earlier"}]}
    assert "systemInstruction" not in out and out["tools"] == []
    assert out["contents"] == [
        {"role": "user", "parts": [{"text": "go"}]},
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "ls", "args": {"dir": "."}, "id": "c1"},
                    "thoughtSignature": SIGNATURE,
                },
                {"functionCall": {"name": "ls", "args": {}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "ls", "response": {"output": "a.py"}, "id": "c1"}},
                {"functionResponse": {"name": "ls", "response": {"output": "b.py"}}},
            ],
        },
    ]


def test_the_registry_finds_a_paths_wire_and_each_base():
    assert providers.for_path("/gateway/gemini/v1beta/models/x:generateContent") is gemini
    assert providers.for_path("/gateway/anthropic/v1/messages").NAME == "anthropic"
    assert providers.for_path("/gateway/nowhere").NAME == "openai"
    assert providers.bases() == {
        "openai": "openai/v1",
        "anthropic": "anthropic",
        "gemini": "gemini",
    }


def test_the_servers_access_log_never_shows_a_key_sent_in_the_query():
    from compaction_app.http_server import LedgerServer, redacted

    logged: list[dict] = []
    server = LedgerServer(
        application=None,
        endpoints=["tcp:port=0:interface=127.0.0.1"],
        action_logger=lambda p, a, d: logged.append(d),
    )
    uri = "/gateway/gemini/v1beta/models/m:generateContent?alt=sse&key=AIzaSecret&x=1"
    server.log_action("http", "complete", {"path": uri, "status": 200})
    assert logged == [
        {
            "path": "/gateway/gemini/v1beta/models/m:generateContent?alt=sse&key=***&x=1",
            "status": 200,
        }
    ]
    assert (
        redacted("/gateway/gemini/v1beta/models?KEY=AIza")
        == "/gateway/gemini/v1beta/models?KEY=***"
    )
    assert redacted("/gateway/anthropic/v1/messages") == "/gateway/anthropic/v1/messages"
    assert redacted("/api/v1/sessions?monkey=1") == "/api/v1/sessions?monkey=1"
    # Percent-encoded, as a passthrough path may carry it (issue 42, row 8), and in a log
    # message (Django's request warnings show the decoded path).
    assert redacted("/v1beta/files%3Fkey=AIza%26x=1") == "/v1beta/files%3Fkey=***%26x=1"
    assert redacted("/v1beta/files%3fKEY%3DAIza") == "/v1beta/files%3fKEY%3D***"
    assert redacted("/v1beta/f%3Fa=1%26key=AIza") == "/v1beta/f%3Fa=1%26key=***"
    assert redacted("Not Found: /gateway/gemini/v1beta/files?key=AIza") == (
        "Not Found: /gateway/gemini/v1beta/files?key=***"
    )


def test_the_ledgers_own_render_of_a_recorded_loop_goes_back_as_valid_contents():
    """The fallback ladder (fit.py): what the ledger recorded of a Gemini loop, rendered in
    its Chat shape, becomes contents whose calls carry their signatures and whose responses
    follow their calls."""
    from sessions_app.render import Record, render

    units = _units(a_tool_loop())
    records = [
        Record(
            key=f"{i}.{n}", type=d.type, content=d.content, name=d.name, tool_call_id=d.tool_call_id
        )
        for i, unit in enumerate(units)
        for n, d in enumerate(gemini.to_client_message(unit, i).drafts)
    ]
    rendered = render(records, fmt=gemini.RENDER_FORMAT)
    body = a_tool_loop()
    out = gemini.with_context(body, messages=rendered.messages, system=rendered.system, model="m")
    assert out["systemInstruction"]["parts"][0]["text"] == "You are an interactive CLI agent."
    assert [c["role"] for c in out["contents"]] == ["user", "model", "user", "model", "user"]
    call = out["contents"][1]["parts"][-1]
    assert call["functionCall"] == {"name": "read_file", "args": {"path": "a.py"}, "id": "call-1"}
    assert call["thoughtSignature"] == SIGNATURE
    response = out["contents"][2]["parts"][0]["functionResponse"]
    assert (response["id"], response["name"]) == ("call-1", "read_file")
    assert out["tools"] is body["tools"]
