"""The gateway's Gemini wire over real HTTP (httpx) against daphne serving the app, the
provider stand-in as Google's API: keys, paths, errors in Google's shape, the routing side
call's own thread, cachedContent, and cache-stable fitting over the threshold. (The official
SDK's own loops are in test_gateway_gemini_sdk.py.)"""

from __future__ import annotations

import http.client
import json
import logging
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from django.apps import apps
from django.core import serializers

from compaction_app.gateway import after, shape
from compaction_app.testkit.provider_standin import GEMINI_SIGNATURE, Received, Step
from sessions_app.models import Call, Event, Session, Thread
from sessions_app.services import session_update
from tests.support.gateway_live import CANARY, token_for, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "clients"
MODEL = "gemini-2.5-flash"


def _post(base: str, path: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(f"{base}/{path}", json=body, headers=headers, timeout=30)


def _ledger(alice, session: str, **more: str) -> dict[str, str]:
    return {"X-Ledger-Key": token_for(alice), "X-Ledger-Session": session, **more}


def _ask(text: str) -> dict:
    return {"role": "user", "parts": [{"text": text}]}


def test_it_forwards_the_key_in_its_header_however_it_came_and_never_keeps_it(
    gemini_gateway_url, upstream, alice, caplog
):
    caplog.set_level(logging.DEBUG)
    body = {"contents": [_ask("hello")]}
    path = f"v1beta/models/{MODEL}:generateContent"
    upstream.script(Step(text="one"), Step(text="two"), Step(text="three"))
    plain = _post(
        gemini_gateway_url, path, body, **_ledger(alice, "keys"), **{"x-goog-api-key": CANARY}
    )
    by_query = _post(gemini_gateway_url, f"{path}?key={CANARY}", body, **_ledger(alice, "keys"))
    bearer = _post(
        gemini_gateway_url, path, body, **_ledger(alice, "keys"), Authorization=f"Bearer {CANARY}"
    )
    assert [r.status_code for r in (plain, by_query, bearer)] == [200, 200, 200]
    sent = upstream.requests[-3:]
    assert sent[0].headers["x-goog-api-key"] == CANARY
    # `?key=` travels upstream as the header: no URL the gateway builds holds it.
    assert sent[1].headers["x-goog-api-key"] == CANARY and CANARY not in sent[1].query
    assert sent[2].headers["authorization"] == f"Bearer {CANARY}"
    assert all(not name.startswith("x-ledger") for r in sent for name in r.headers)
    # Passed through too: a key in the query of any other path goes as the header.
    listed = httpx.get(
        f"{gemini_gateway_url}/v1beta/models?key={CANARY}&pageSize=5",
        headers=_ledger(alice, "keys"),
        timeout=30,
    )
    assert listed.status_code == 200 and listed.json()["models"]
    assert upstream.requests[-1].query == "pageSize=5"
    assert upstream.requests[-1].headers["x-goog-api-key"] == CANARY
    after.wait_idle()
    dump = "".join(serializers.serialize("json", m.objects.all()) for m in apps.get_models())
    assert "keys" in dump and CANARY not in dump
    # The server's logs (this process serves; the test's own HTTP client logs its URLs).
    for record in caplog.records:
        if record.name.startswith(("httpx", "httpcore")):
            continue
        assert CANARY not in record.getMessage() and CANARY not in str(record.__dict__)
    assert Call.objects.filter(wire="gemini", status="ok").count() == 3


def test_it_keeps_unknown_fields_signatures_and_ids_byte_for_byte(
    gemini_gateway_url, upstream, alice
):
    body = {
        "system_instruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            _ask("Read a.py"),
            {
                "role": "model",
                "parts": [
                    {
                        "function_call": {"id": "fc-1", "name": "read", "args": {"p": "a.py"}},
                        "thought_signature": GEMINI_SIGNATURE,
                    }
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "function_response": {
                            "id": "fc-1",
                            "name": "read",
                            "response": {"output": "x = 1"},
                            "willContinue": False,
                        }
                    }
                ],
            },
        ],
        "generation_config": {"temperature": 0.2, "futureKnob": {"deep": [1, 2.5]}},
        "labels": {"team": "ledger"},
    }
    # Spaced as a person would write it: forwarded as these very bytes.
    raw = json.dumps(body, indent=1).encode()
    answer = httpx.post(
        f"{gemini_gateway_url}/v1/models/{MODEL}:generateContent",
        content=raw,
        headers={**_ledger(alice, "exact"), "x-goog-api-key": CANARY},
        timeout=30,
    )
    assert answer.status_code == 200
    assert answer.headers["X-Ledger-Model"] == MODEL
    sent = upstream.requests[-1]
    assert sent.path == f"/v1/models/{MODEL}:generateContent"
    assert sent.body == body  # nothing fitted: the client's own bytes
    assert sent.raw == raw
    session = Session.objects.get(client_key="exact")
    types = [e.type for e in Event.objects.filter(session=session).order_by("seq")]
    assert types == [
        "SYSTEM_PROMPT",
        "USER_MESSAGE",
        "AGENT_MESSAGE",  # the call's signature, kept beside it
        "TOOL_CALL",
        "TOOL_RESULT",
        "AGENT_MESSAGE",
    ]
    signed = Event.objects.filter(session=session, type="AGENT_MESSAGE").order_by("seq").first()
    assert GEMINI_SIGNATURE in signed.content
    call = Event.objects.get(session=session, type="TOOL_CALL")
    assert (call.tool_call_id, call.name) == ("fc-1", "read")


def test_it_streams_sse_chunks_and_records_the_reply(gemini_gateway_url, upstream, alice):
    upstream.script(
        Step(text="It is a small module.", tool_calls=(("c-7", "read", '{"p": "b.py"}'),))
    )
    with httpx.stream(
        "POST",
        f"{gemini_gateway_url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse",
        json={"contents": [_ask("What is b.py?")]},
        headers={**_ledger(alice, "streamed"), "x-goog-api-key": CANARY},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(response.iter_raw())
    chunks = [json.loads(line[6:]) for line in raw.split(b"\r\n\r\n") if line.startswith(b"data: ")]
    assert len(chunks) > 1 and b"[DONE]" not in raw  # relayed as the API sends it
    assert upstream.requests[-1].query == "alt=sse"
    after.wait_idle()
    session = Session.objects.get(client_key="streamed")
    stored = list(Event.objects.filter(session=session).order_by("seq"))
    assert [e.type for e in stored] == ["USER_MESSAGE", "AGENT_MESSAGE", "TOOL_CALL"]
    # The text pieces joined; the call's signature kept beside them.
    own = json.loads(stored[1].content)
    assert own[0] == {"text": "It is a small module."}
    assert own[1]["thoughtSignature"] == GEMINI_SIGNATURE
    assert stored[2].tool_call_id == "c-7"
    call = wait_until(lambda: Call.objects.filter(session=session).first())
    assert call.stream and call.status == "ok" and call.prompt_tokens and call.cost_nano_usd


def test_it_records_a_stream_sent_as_one_json_array(gemini_gateway_url, upstream, alice):
    upstream.script(Step(text="An array of chunks."))
    answer = _post(
        gemini_gateway_url,
        f"v1beta/models/{MODEL}:streamGenerateContent",
        {"contents": [_ask("No alt.")]},
        **_ledger(alice, "array"),
    )
    assert answer.status_code == 200 and isinstance(answer.json(), list)
    assert upstream.requests[-1].query == ""
    after.wait_idle()
    session = Session.objects.get(client_key="array")
    reply = Event.objects.filter(session=session).order_by("seq").last()
    assert reply.type == "AGENT_MESSAGE" and reply.content == "An array of chunks."


def test_it_fails_over_to_a_fallback_model_named_in_the_path(gemini_gateway_url, upstream, alice):
    upstream.script(Step(kind="error", status=503, message="overloaded"), Step(text="From lite."))
    body = {"contents": [_ask("Summarize the plan.")]}
    answer = _post(
        gemini_gateway_url,
        f"v1beta/models/{MODEL}:generateContent",
        body,
        **_ledger(alice, "failover"),
        **{"X-Ledger-Fallback-Models": "gemini-2.5-flash-lite"},
    )
    assert answer.status_code == 200 and answer.headers["X-Ledger-Model"] == "gemini-2.5-flash-lite"
    first, second = upstream.requests[-2:]
    assert first.path == f"/v1beta/models/{MODEL}:generateContent"
    assert second.path == "/v1beta/models/gemini-2.5-flash-lite:generateContent"
    assert second.body == body  # the model is in the path, never added to the body


def test_it_relays_a_stream_that_fails_midway_and_marks_the_reply_incomplete(
    gemini_gateway_url, upstream, alice
):
    upstream.script(Step(kind="stream_error", text="A long answer " * 20, chunks_before_break=2))
    with httpx.stream(
        "POST",
        f"{gemini_gateway_url}/v1/models/{MODEL}:streamGenerateContent?alt=sse",
        json={"contents": [_ask("Go on.")]},
        headers=_ledger(alice, "midway"),
        timeout=30,
    ) as response:
        raw = b"".join(response.iter_raw())
    last = [chunk for chunk in raw.split(b"\r\n\r\n") if chunk.startswith(b"data: ")][-1]
    assert json.loads(last[6:])["error"]["status"] == "INTERNAL"
    after.wait_idle()
    session = Session.objects.get(client_key="midway")
    reply = Event.objects.filter(session=session).order_by("seq").last()
    assert reply.type == "AGENT_MESSAGE" and reply.metadata["incomplete"] is True
    call = wait_until(lambda: Call.objects.filter(session=session).first())
    assert call.status == "provider_error"


def test_it_counts_tokens_itself(gemini_gateway_url, upstream, alice):
    body = {"contents": [_ask("count me " * 20)]}
    counted = _post(
        gemini_gateway_url, f"v1/models/{MODEL}:countTokens", body, **_ledger(alice, "count")
    )
    wrapped = _post(
        gemini_gateway_url,
        f"v1beta/models/{MODEL}:countTokens",
        {"generateContentRequest": {"model": f"models/{MODEL}", **body}},
        **_ledger(alice, "count"),
    )
    assert counted.status_code == wrapped.status_code == 200
    assert counted.json() == wrapped.json() and counted.json()["totalTokens"] > 40
    assert not upstream.requests
    assert not Session.objects.filter(client_key="count").exists()  # nothing recorded


def test_it_answers_its_own_errors_in_googles_shape(gemini_gateway_url, upstream, alice):
    path = f"v1beta/models/{MODEL}:generateContent"
    missing = _post(gemini_gateway_url, path, {"contents": [_ask("x")]})
    assert missing.status_code == 401
    assert missing.json()["error"]["status"] == "UNAUTHENTICATED"
    assert missing.json()["error"]["code"] == 401
    bad = _post(gemini_gateway_url, path, {"contents": []}, **_ledger(alice, "bad"))
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert "contents" in error["message"]
    wrong_role = _post(
        gemini_gateway_url,
        path,
        {"contents": [{"role": "robot", "parts": [{"text": "x"}]}]},
        **_ledger(alice, "bad"),
    )
    assert wrong_role.json()["error"]["details"][0]["metadata"]["param"] == "contents[0].role"
    method = httpx.get(f"{gemini_gateway_url}/{path}", headers=_ledger(alice, "bad"), timeout=30)
    assert method.status_code == 405 and method.json()["error"]["code"] == 405
    assert not upstream.requests and not Session.objects.filter(client_key="bad").exists()
    # The provider's own errors are relayed as sent, and noted on the call.
    upstream.script(Step(kind="error", status=429, message="Resource has been exhausted"))
    limited = _post(gemini_gateway_url, path, {"contents": [_ask("x")]}, **_ledger(alice, "429"))
    assert limited.status_code == 429
    assert limited.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    after.wait_idle()
    call = Call.objects.get(session__client_key="429")
    assert (call.status, call.error_code) == ("provider_error", "RESOURCE_EXHAUSTED")


def test_it_passes_other_paths_through_within_the_base(gemini_gateway_url, upstream, alice):
    model = httpx.get(
        f"{gemini_gateway_url}/v1beta/models/{MODEL}", headers=_ledger(alice, "p"), timeout=30
    )
    assert model.status_code == 200 and model.json()["name"] == f"models/{MODEL}"
    # Encoded (an HTTP client resolves a plain `..` before sending).
    for escape in ("v1beta/%2e%2e/admin", "v1beta/%252e%252e/admin", "v1beta/..%2Fadmin"):
        refused = httpx.get(
            f"{gemini_gateway_url}/{escape}", headers=_ledger(alice, "p"), timeout=30
        )
        assert refused.status_code in (400, 404), escape
        assert refused.json()["error"]["status"] in ("INVALID_ARGUMENT", "NOT_FOUND")
    assert [r.path for r in upstream.requests] == [f"/v1beta/models/{MODEL}"]
    anonymous = httpx.get(f"{gemini_gateway_url}/v1beta/models", timeout=30)
    assert anonymous.status_code == 401  # no open proxy


def test_it_forwards_a_request_naming_cached_content_unfitted(gemini_gateway_url, upstream, alice):
    headers = _ledger(alice, "cached")
    first = {"contents": [_ask("Start " * 50)]}
    assert _post(gemini_gateway_url, f"v1beta/models/{MODEL}:generateContent", first, **headers)
    session = Session.objects.get(client_key="cached")
    session_update(session=session, context_limit=400)
    body = {
        "cachedContent": "cachedContents/abc123",
        # Past the window: fitted, this would lose its early turns.
        "contents": [
            content
            for step in range(4)
            for content in (
                _ask(f"Step {step} " * 40),
                {"role": "model", "parts": [{"text": f"done {step} " * 40}]},
            )
        ]
        + [_ask("Next " * 60)],
    }
    answer = _post(gemini_gateway_url, f"v1beta/models/{MODEL}:generateContent", body, **headers)
    assert answer.status_code == 200
    assert answer.headers["X-Ledger-Compacted"] == "false"
    assert int(answer.headers["X-Ledger-Context-Tokens"]) > 400
    # As httpx wrote it: compact JSON.
    assert upstream.requests[-1].raw == json.dumps(body, separators=(",", ":")).encode()


def test_it_threads_gemini_clis_routing_side_call_apart(gemini_gateway_url, upstream, alice):
    """Gemini CLI asks a small model to route each prompt (its own instruction, a JSON schema
    for the answer, no tools) before the main call: captured requests, replayed."""
    routing = json.loads((FIXTURES / "gemini_cli_0.61.0_routing_request.json").read_text())
    main = json.loads((FIXTURES / "gemini_cli_0.61.0_first_request.json").read_text())
    assert "responseJsonSchema" in json.dumps(routing["body"]) and "tools" not in routing["body"]
    headers = _ledger(alice, "cli")
    upstream.script(Step(text='{"complexity_score": 12}'), Step(text="It holds notes."))
    route = _post(gemini_gateway_url, routing["path"][1:], routing["body"], **headers)
    assert route.status_code == 200
    answered = _post(
        gemini_gateway_url,
        main["path"][1:].replace("streamGenerateContent", "generateContent"),
        main["body"],
        **headers,
    )
    assert answered.status_code == 200
    after.wait_idle()
    session = Session.objects.get(client_key="cli")
    threads = {e.metadata["thread"] for e in Event.objects.filter(session=session)}
    assert len(threads) == 2 and Thread.objects.filter(session=session).count() == 2
    routed = Event.objects.filter(session=session, content='{"complexity_score": 12}').get()
    main_reply = Event.objects.filter(session=session, content="It holds notes.").get()
    assert routed.metadata["thread"] != main_reply.metadata["thread"]


# --- fitting over the threshold -------------------------------------------------------------

WINDOW = 6000
TURNS = 90


def _contents_bytes(raw: bytes) -> str:
    text = raw.decode()
    start = text.index("[", text.index('"contents"'))
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end]


def _prefix_stable(previous: Received, current: Received) -> bool:
    rest = [{k: v for k, v in r.body.items() if k != "contents"} for r in (previous, current)]
    if rest[0] != rest[1]:
        return False
    return _contents_bytes(current.raw).startswith(_contents_bytes(previous.raw)[:-1])


def _tool_output(turn: int) -> str:
    return f"line {turn}: " + "def handler(request): return respond(request.body)\n" * 25


def test_it_fits_a_long_conversation_prefix_stable_with_the_current_turn_intact(
    gemini_gateway_url, upstream, alice
):
    headers = {**_ledger(alice, "stable-gemini"), "x-goog-api-key": CANARY}
    path = f"v1beta/models/{MODEL}:generateContent"
    system = {"parts": [{"text": "You are Gemini CLI."}]}
    tools = [{"functionDeclarations": [{"name": "read_file", "parameters": {"type": "object"}}]}]
    contents: list[dict] = []
    fitted_at = None
    sent_headers = []
    for turn in range(TURNS):
        contents.append(_ask(f"Step {turn}: look at module_{turn}.py. " * 6))
        if turn % 3 == 0:
            upstream.script(
                Step(text="Reading it.", tool_calls=((f"call_{turn}", "read_file", "{}"),))
            )
            body = {"systemInstruction": system, "tools": tools, "contents": contents}
            reply = _post(gemini_gateway_url, path, body, **headers).json()
            model_turn = reply["candidates"][0]["content"]
            assert model_turn["parts"][-1]["thoughtSignature"] == GEMINI_SIGNATURE
            contents.append(model_turn)
            contents.append(
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "id": f"call_{turn}",
                                "name": "read_file",
                                "response": {"output": _tool_output(turn)},
                            }
                        }
                    ],
                }
            )
        body = {"systemInstruction": system, "tools": tools, "contents": contents}
        answer = _post(gemini_gateway_url, path, body, **headers)
        assert answer.status_code == 200, answer.text
        sent_headers.append(answer.headers)
        forwarded = upstream.requests[-1].body
        # The current turn, from the last user text to the end, goes out as the client sent
        # it: the call with its signature and id, the response with its id.
        current = _current_turn(contents)
        assert forwarded["contents"][-len(current) :] == current
        if turn == 0:
            session_update(
                session=Session.objects.get(client_key="stable-gemini"), context_limit=WINDOW
            )
        if fitted_at is None and answer.headers["X-Ledger-Compacted"] == "true":
            fitted_at = len(upstream.requests) - 1
        contents.append(answer.json()["candidates"][0]["content"])
    after.wait_idle()
    assert fitted_at is not None, "the conversation never reached the compact threshold"
    assert all(int(h["X-Ledger-Context-Tokens"]) <= 0.95 * WINDOW for h in sent_headers)
    forwarded_all = upstream.requests
    pairs = list(zip(forwarded_all[fitted_at:], forwarded_all[fitted_at + 1 :], strict=False))
    stable = sum(_prefix_stable(a, b) for a, b in pairs)
    print(f"gemini: {stable}/{len(pairs)} forwarded requests prefix-stable")
    assert stable >= 0.9 * len(pairs)
    last = forwarded_all[-1].body
    # The instruction as sent, the summary one more part after it; the tools as sent.
    assert last["systemInstruction"]["parts"][0] == system["parts"][0]
    assert last["systemInstruction"]["parts"][-1]["text"].startswith(shape.SUMMARY_HEADER)
    assert last["tools"] == tools
    assert len(last["contents"]) < len(contents)
    # Every kept functionResponse still follows its call.
    calls = set()
    for content in last["contents"]:
        for part in content["parts"]:
            if "functionCall" in part:
                calls.add(part["functionCall"]["id"])
            if "functionResponse" in part:
                assert part["functionResponse"]["id"] in calls


def _current_turn(contents: list[dict]) -> list[dict]:
    """From the last user text to the end."""
    for index in range(len(contents) - 1, -1, -1):
        content = contents[index]
        if content.get("role") == "user" and any("text" in p for p in content["parts"]):
            return contents[index:]
    return contents


@pytest.mark.parametrize(
    ("sent", "path"),
    [
        ("v1beta/files%3Fkey=SECRET-K", "/v1beta/files%3Fkey=SECRET-K"),
        ("v1beta/files%3fKEY%3DSECRET-K", "/v1beta/files%3FKEY=SECRET-K"),
        ("v1beta/files/a%23b%20c", "/v1beta/files/a%23b%20c"),
        ("v1beta/files/caf%C3%A9", "/v1beta/files/caf%C3%A9"),
    ],
)
def test_it_passes_an_encoded_path_through_as_encoded(
    gemini_gateway_url, upstream, alice, sent, path
):
    """Issue 42, row 8: Django hands the view the path decoded, and `files%3Fkey=K` was
    forwarded as `files?key=K`: a query holding a key the client never put in one."""
    parts = urlsplit(gemini_gateway_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request("GET", f"{parts.path}/{sent}", headers=_ledger(alice, "encoded"))
    connection.getresponse().read()
    connection.close()
    (received,) = upstream.requests
    assert received.path == path
    assert received.query == ""
