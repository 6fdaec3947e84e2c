"""Bad input: every case is a 4xx with an error code and a detail, stores nothing and leaves the
session's counters as they were. Never a 500."""

from __future__ import annotations

import json

import pytest

from sessions_app.models import Event, Session

SESSIONS = "/api/v1/sessions"


@pytest.fixture
def session(alice_api):
    response = alice_api.post(
        SESSIONS,
        {"model": "gpt-4o", "systemPrompt": "sys", "settings": {"autoCompact": False}},
        format="json",
    )
    assert response.status_code == 201
    body = response.json()
    ok = alice_api.post(
        f"{SESSIONS}/{body['id']}/events",
        {
            "type": "AGENT_MESSAGE",
            "content": "hi",
            "tokenUsage": {"promptTokens": 3, "completionTokens": 1, "totalTokens": 4},
        },
        format="json",
    )
    assert ok.status_code == 201
    return body


def state(session_id):
    """Everything an append could change: the session row's counters and the stored events."""
    row = Session.objects.filter(pk=session_id).values().get()
    row.pop("updated_at")
    events = list(Event.objects.filter(session_id=session_id).order_by("seq").values())
    return row, events, Event.objects.count(), Session.objects.count()


def post_raw(api, url, raw: str | bytes):
    return api.generic("POST", url, raw, content_type="application/json")


def assert_refused(response, status, error, field=None):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"] == error, body
    assert isinstance(body["detail"], str) and body["detail"]
    if field is not None:
        assert field in body["fields"], body
    return body


@pytest.fixture
def append(alice_api, session):
    """POST to the session's events and check nothing changed; returns the response."""

    def do(payload=None, *, raw=None):
        url = f"{SESSIONS}/{session['id']}/events"
        before = state(session["id"])
        usage_before = alice_api.get(f"{SESSIONS}/{session['id']}/usage").json()
        if raw is not None:
            response = post_raw(alice_api, url, raw)
        else:
            response = alice_api.post(url, payload, format="json")
        assert state(session["id"]) == before
        assert alice_api.get(f"{SESSIONS}/{session['id']}/usage").json() == usage_before
        return response

    return do


@pytest.mark.parametrize(
    "raw", ['{"type": "USER_MESSAGE", "content": "x"', "{'type': 1}", "not json", '{"a": NaN}']
)
def test_it_refuses_malformed_json(append, raw):
    assert_refused(append(raw=raw), 400, "malformed_json")


def test_it_refuses_malformed_json_on_session_create(alice_api):
    assert_refused(post_raw(alice_api, SESSIONS, '{"model": '), 400, "malformed_json")
    assert not Session.objects.exists()


def test_it_refuses_invalid_utf8(append):
    assert_refused(
        append(raw=b'{"type": "USER_MESSAGE", "content": "\xff\xfe"}'), 400, "malformed_json"
    )


def test_it_refuses_a_body_that_is_neither_object_nor_list(append):
    assert_refused(append(raw="42"), 400, "invalid_request")
    assert_refused(append(raw='"text"'), 400, "invalid_request")


def test_it_refuses_a_non_json_content_type(alice_api, session):
    before = state(session["id"])
    response = alice_api.post(
        f"{SESSIONS}/{session['id']}/events", "type=USER_MESSAGE", content_type="text/plain"
    )
    assert_refused(response, 415, "unsupported_media_type")
    assert state(session["id"]) == before


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"type": "USER_MESSAGE", "content": 42}, "content"),
        ({"type": "USER_MESSAGE", "content": True}, "content"),
        ({"type": "USER_MESSAGE", "content": "x", "pinned": "yes"}, "pinned"),
        ({"type": "USER_MESSAGE", "content": "x", "pinned": 1}, "pinned"),
        (
            {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": "5"}},
            "tokenUsage.promptTokens",
        ),
        (
            {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": 1.5}},
            "tokenUsage.promptTokens",
        ),
        (
            {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": -1}},
            "tokenUsage.promptTokens",
        ),
        (
            {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"completionTokens": True}},
            "tokenUsage.completionTokens",
        ),
        (
            {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"totalTokens": -3}},
            "tokenUsage.totalTokens",
        ),
        ({"type": "USER_MESSAGE", "content": "x", "tokenUsage": "lots"}, "tokenUsage"),
        ({"type": "USER_MESSAGE", "content": "x", "name": 5}, "name"),
        ({"type": "USER_MESSAGE", "content": "x", "metadata": [1]}, "metadata"),
        ({"type": "USER_MESSAGE", "content": "x", "id": "not-a-uuid"}, "id"),
        ({"type": "TOOL_CALL", "content": "{}", "name": "ls", "toolCallId": 7}, "toolCallId"),
    ],
)
def test_it_refuses_wrong_types(append, payload, field):
    assert_refused(append(payload), 400, "invalid_request", field)


@pytest.mark.parametrize("kind", ["SHOUT", "user_message", "", None, 3])
def test_it_refuses_an_unknown_event_type(append, kind):
    assert_refused(append({"type": kind, "content": "x"}), 400, "invalid_request", "type")


def test_it_refuses_missing_content(append):
    body = assert_refused(append({"type": "USER_MESSAGE"}), 400, "invalid_request", "content")
    assert "required" in body["fields"]["content"]


def test_it_refuses_null_content(append):
    assert_refused(
        append({"type": "USER_MESSAGE", "content": None}), 400, "invalid_request", "content"
    )


def test_it_refuses_a_missing_type(append):
    assert_refused(append({"content": "x"}), 400, "invalid_request", "type")


def test_it_refuses_a_lone_surrogate_in_content(append):
    raw = '{"type":"USER_MESSAGE","content":"\\ud800"}'
    body = assert_refused(append(raw=raw), 400, "invalid_content", "content")
    assert "surrogate" in body["fields"]["content"]


def test_it_refuses_a_lone_surrogate_inside_structured_content(append):
    raw = '{"type":"USER_MESSAGE","content":[{"type":"text","text":"ok \\udfff"}]}'
    assert_refused(append(raw=raw), 400, "invalid_content", "content")


def test_it_refuses_a_nul_byte_in_content(append):
    body = assert_refused(
        append({"type": "USER_MESSAGE", "content": "a\x00b"}), 400, "invalid_content", "content"
    )
    assert "NUL" in body["fields"]["content"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"type":"USER_MESSAGE","content":"x","metadata":{"k":"\\u0000"}}', "metadata"),
        ('{"type":"USER_MESSAGE","content":"x","metadata":{"\\ud800":1}}', "metadata"),
        ('{"type":"USER_MESSAGE","content":"x","name":"a\\u0000"}', "name"),
        ('{"type":"TOOL_RESULT","content":"x","toolCallId":"\\udc00"}', "toolCallId"),
    ],
)
def test_it_refuses_bad_text_in_other_fields(append, raw, field):
    assert_refused(append(raw=raw), 400, "invalid_content", field)


def test_it_refuses_a_bulk_list_with_one_bad_event(append):
    payload = [
        {"type": "USER_MESSAGE", "content": "fine"},
        {"type": "AGENT_MESSAGE", "content": "fine too"},
        {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": -1}},
    ]
    body = assert_refused(append(payload), 400, "invalid_request", "[2].tokenUsage.promptTokens")
    assert list(body["fields"]) == ["[2].tokenUsage.promptTokens"]


def test_it_refuses_a_bulk_list_with_a_lone_surrogate(append):
    raw = (
        '[{"type":"USER_MESSAGE","content":"fine"},{"type":"USER_MESSAGE","content":"bad \\ud83d"}]'
    )
    assert_refused(append(raw=raw), 400, "invalid_content", "[1].content")


def test_it_refuses_a_bulk_list_with_a_non_object_item(append):
    assert_refused(
        append([{"type": "USER_MESSAGE", "content": "fine"}, "oops"]), 400, "invalid_request", "[1]"
    )


def test_it_refuses_an_oversize_body(append, settings):
    settings.API_MAX_BODY_BYTES = 2048
    body = assert_refused(
        append({"type": "USER_MESSAGE", "content": "x" * 4096}), 413, "request_too_large"
    )
    assert body["limit"] == 2048


def test_it_accepts_a_body_just_under_the_limit(alice_api, session, settings):
    settings.API_MAX_BODY_BYTES = 2048
    payload = json.dumps({"type": "USER_MESSAGE", "content": "x" * 1900})
    assert len(payload) < 2048
    assert post_raw(alice_api, f"{SESSIONS}/{session['id']}/events", payload).status_code == 201


def test_it_refuses_an_oversize_session_create(alice_api, settings):
    settings.API_MAX_BODY_BYTES = 1024
    response = alice_api.post(
        SESSIONS, {"model": "gpt-4o", "systemPrompt": "y" * 2000}, format="json"
    )
    assert_refused(response, 413, "request_too_large")
    assert not Session.objects.exists()


@pytest.mark.parametrize(
    ("payload", "status", "error", "field"),
    [
        ({"model": "no-such-model"}, 400, "unknown_model", "model"),
        ({"model": "no-such-model", "contextLimit": None}, 400, "unknown_model", "model"),
        (
            {"model": "no-such-model", "contextLimit": 0},
            400,
            "invalid_context_limit",
            "contextLimit",
        ),
        ({"model": "gpt-4o", "contextLimit": -1}, 400, "invalid_context_limit", "contextLimit"),
        ({"model": "gpt-4o", "contextLimit": 2.5}, 400, "invalid_request", "contextLimit"),
        ({"model": "gpt-4o", "contextLimit": "100"}, 400, "invalid_request", "contextLimit"),
        ({"model": ""}, 400, "invalid_request", "model"),
        ({"model": "   "}, 400, "invalid_model", "model"),
        ({"model": 4}, 400, "invalid_request", "model"),
        ({}, 400, "invalid_request", "model"),
        ({"model": "gpt-4o", "title": "a\x00"}, 400, "invalid_content", "title"),
        ({"model": "gpt-4o", "systemPrompt": "a\x00"}, 400, "invalid_content", "systemPrompt"),
        ({"model": "gpt-4o", "systemPrompt": 5}, 400, "invalid_request", "systemPrompt"),
        ({"model": "gpt\x00x", "contextLimit": 100}, 400, "invalid_content", "model"),
        ({"model": "gpt-4o", "title": "t" * 201}, 400, "invalid_request", "title"),
    ],
)
def test_it_refuses_bad_session_input(alice_api, payload, status, error, field):
    response = alice_api.post(SESSIONS, payload, format="json")
    assert_refused(response, status, error, field)
    assert not Session.objects.exists()
    assert not Event.objects.exists()


def test_it_refuses_a_session_body_that_is_a_list(alice_api):
    assert_refused(
        alice_api.post(SESSIONS, [{"model": "gpt-4o"}], format="json"), 400, "invalid_request"
    )


def test_it_refuses_lone_surrogates_in_session_fields(alice_api):
    for raw in (
        '{"model":"gpt-4o","title":"\\ud800"}',
        '{"model":"x\\ud800","contextLimit":100}',
        '{"model":"gpt-4o","systemPrompt":"\\udfff"}',
    ):
        assert_refused(post_raw(alice_api, SESSIONS, raw), 400, "invalid_content")
    assert not Session.objects.exists()


def test_it_echoes_a_surrogate_in_an_error_without_crashing(append):
    body = assert_refused(
        append(raw='{"type":"\\ud800","content":"x"}'), 400, "invalid_request", "type"
    )
    json.dumps(body)


def test_it_refuses_unknown_patch_fields(alice_api, session):
    before = state(session["id"])
    response = alice_api.patch(
        f"{SESSIONS}/{session['id']}", {"model": "gpt-4", "encoding": "x"}, format="json"
    )
    assert_refused(response, 400, "invalid_request", "model")
    assert state(session["id"]) == before


def test_it_refuses_bad_token_count_input(alice_api):
    for payload, field in [
        ({"text": "x"}, "model"),
        ({"model": "gpt-4o", "encoding": "cl100k_base", "text": "x"}, "model"),
        ({"model": "gpt-4o"}, "text"),
        ({"model": "gpt-4o", "text": 5}, "text"),
        ({"encoding": "p50k_base", "text": "x"}, "encoding"),
        ({"model": "gpt-4o", "messages": [{"content": "x"}]}, "messages[0]"),
        ({"model": "gpt-4o", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": "gpt-4o", "messages": "hi"}, "messages"),
    ]:
        response = alice_api.post("/api/v1/tokens/count", payload, format="json")
        assert_refused(response, 400, "invalid_request", field)
    assert_refused(
        alice_api.post("/api/v1/tokens/count", {"model": "gpt-4o", "text": "a\x00"}, format="json"),
        400,
        "invalid_content",
        "text",
    )


@pytest.mark.parametrize(
    "params",
    [{"maxTokens": "lots"}, {"maxTokens": 0}, {"reserveTokens": -1}, {"format": "gemini"}],
)
def test_it_refuses_bad_context_parameters(alice_api, session, params):
    response = alice_api.get(f"{SESSIONS}/{session['id']}/context", params)
    assert response.status_code == 400
    assert response.json()["error"] in ("invalid_parameter", "invalid_request")
    assert next(iter(params)) in response.json()["fields"]


# --- nesting, huge numbers, non-string types ---------------------------------------------------


def nested(depth: int) -> str:
    """A JSON array nested `depth` levels deep."""
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize(
    "template",
    [
        '{"type":"USER_MESSAGE","content":DEEP}',
        '{"type":"USER_MESSAGE","content":"x","metadata":{"deep":DEEP}}',
        '[{"type":"USER_MESSAGE","content":"fine"},{"type":"USER_MESSAGE","content":DEEP}]',
    ],
    ids=["content", "metadata", "bulk"],
)
def test_it_refuses_deeply_nested_event_json(append, template, depth):
    body = assert_refused(
        append(raw=template.replace("DEEP", nested(depth))), 400, "nesting_too_deep"
    )
    assert body["limit"] == 64


def test_it_accepts_structured_content_nested_within_the_limit(alice_api, session):
    raw = '{"type":"USER_MESSAGE","content":DEEP}'.replace("DEEP", nested(60))
    response = post_raw(alice_api, f"{SESSIONS}/{session['id']}/events", raw)
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_it_refuses_deeply_nested_session_settings(alice_api, depth):
    raw = '{"model":"gpt-4o","settings":{"autoCompact":DEEP}}'.replace("DEEP", nested(depth))
    assert_refused(post_raw(alice_api, SESSIONS, raw), 400, "nesting_too_deep")
    assert not Session.objects.exists()


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_it_refuses_deeply_nested_settings_in_a_patch(alice_api, session, depth):
    before = state(session["id"])
    raw = '{"settings":{"autoCompact":DEEP}}'.replace("DEEP", nested(depth))
    response = alice_api.generic(
        "PATCH", f"{SESSIONS}/{session['id']}", raw, content_type="application/json"
    )
    assert_refused(response, 400, "nesting_too_deep")
    assert state(session["id"]) == before


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_it_refuses_deeply_nested_token_count_messages(alice_api, depth):
    raw = '{"model":"gpt-4o","messages":[{"role":"user","content":DEEP}]}'.replace(
        "DEEP", nested(depth)
    )
    assert_refused(post_raw(alice_api, "/api/v1/tokens/count", raw), 400, "nesting_too_deep")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("promptTokens", 2**63),
        ("completionTokens", 2**64 + 5),
        ("totalTokens", 2**63 - 1),
        ("totalTokens", 10**12 + 1),
    ],
)
def test_it_refuses_a_token_usage_value_past_the_bound(append, key, value):
    payload = {"type": "AGENT_MESSAGE", "content": "x", "tokenUsage": {key: value}}
    assert_refused(append(payload), 400, "invalid_request", f"tokenUsage.{key}")
    assert_refused(append([payload]), 400, "invalid_request", f"[0].tokenUsage.{key}")


def test_it_keeps_a_session_usable_after_a_maximal_token_usage(alice_api, session):
    url = f"{SESSIONS}/{session['id']}/events"
    biggest = {"promptTokens": 10**12, "completionTokens": 10**12, "totalTokens": 10**12}
    first = alice_api.post(
        url, {"type": "AGENT_MESSAGE", "content": "a", "tokenUsage": biggest}, format="json"
    )
    assert first.status_code == 201, first.content
    later = alice_api.post(
        url,
        {"type": "AGENT_MESSAGE", "content": "b", "tokenUsage": {"totalTokens": 5}},
        format="json",
    )
    assert later.status_code == 201, later.content
    usage = alice_api.get(f"{SESSIONS}/{session['id']}/usage").json()
    assert usage["totalTokens"] == 10**12 + 4 + 5
    assert usage["reportedEventCount"] == 3


def test_it_refuses_an_append_that_would_push_a_running_total_past_the_bound(
    alice_api, session, append
):
    # The fixture's event reported 4 total tokens; 999 reports of 10^12 bring the total to
    # 10^15 − 10^12 + 4, and one more of 10^12 would pass 10^15.
    url = f"{SESSIONS}/{session['id']}/events"
    bulk = [{"type": "AGENT_MESSAGE", "content": "r", "tokenUsage": {"totalTokens": 10**12}}] * 999
    assert alice_api.post(url, bulk, format="json").status_code == 201
    body = assert_refused(
        append({"type": "AGENT_MESSAGE", "content": "s", "tokenUsage": {"totalTokens": 10**12}}),
        422,
        "token_usage_total_exceeded",
    )
    assert body["limit"] == 10**15
    # Only usage that would overflow is refused: the session still takes events.
    assert (
        alice_api.post(
            url,
            {"type": "AGENT_MESSAGE", "content": "t", "tokenUsage": {"totalTokens": 1}},
            format="json",
        ).status_code
        == 201
    )
    assert alice_api.get(f"{SESSIONS}/{session['id']}/usage").json()["totalTokens"] == (
        10**15 - 10**12 + 5
    )


@pytest.mark.parametrize("kind", [["USER_MESSAGE"], {"a": 1}, 1.5, True])
def test_it_refuses_a_non_string_event_type(append, kind):
    assert_refused(append({"type": kind, "content": "x"}), 400, "invalid_request", "type")
    assert_refused(
        append([{"type": "USER_MESSAGE", "content": "x"}, {"type": kind, "content": "x"}]),
        400,
        "invalid_request",
        "[1].type",
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cooldownSeconds", 10**30),
        ("maxSummaryTokens", 2**63),
        ("keepRecentEvents", 10**20),
        ("refreshThresholdTokens", 2**70),
    ],
)
def test_it_refuses_a_settings_integer_past_its_bound(alice_api, session, key, value):
    created = alice_api.post(SESSIONS, {"model": "gpt-4o", "settings": {key: value}}, format="json")
    assert_refused(created, 400, "invalid_settings", f"settings.{key}")
    before = state(session["id"])
    patched = alice_api.patch(
        f"{SESSIONS}/{session['id']}", {"settings": {key: value}}, format="json"
    )
    assert_refused(patched, 400, "invalid_settings", f"settings.{key}")
    assert state(session["id"]) == before
    assert Session.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"seqs": [2**63]}, "seqs[0]"),
        ({"seqs": [10**30]}, "seqs[0]"),
        ({"query": "x", "maxTokens": 10**30}, "maxTokens"),
    ],
)
def test_it_refuses_huge_numbers_in_a_recall(alice_api, session, body, field):
    response = alice_api.post(f"{SESSIONS}/{session['id']}/recall", body, format="json")
    assert_refused(response, 400, "invalid_request", field)


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("events", "after=99999999999999999999"),
        ("events", "after="),
        ("events", "limit=1_0"),
        ("search", "q=x&limit=1_0"),
        ("search", "q=x&limit=99999999999999999999"),
        ("context", "maxTokens=%205"),
    ],
)
def test_it_refuses_malformed_or_huge_integer_parameters(alice_api, session, path, query):
    response = alice_api.get(f"{SESSIONS}/{session['id']}/{path}?{query}")
    assert_refused(response, 400, "invalid_parameter", query.split("&")[-1].split("=")[0])


# --- numbers a double cannot hold -----------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        '{"type":"USER_MESSAGE","content":[{"type":"text","text":"x","weight":1e400}]}',
        '{"type":"USER_MESSAGE","content":[{"type":"text","text":"x","weight":-1e400}]}',
        '{"type":"USER_MESSAGE","content":"x","metadata":{"score":1e400}}',
        '[{"type":"USER_MESSAGE","content":"fine"},'
        '{"type":"AGENT_MESSAGE","content":{"n":[1.5e999]}}]',
    ],
)
def test_it_refuses_a_number_that_overflows_a_double(alice_api, session, append, raw):
    # Valid JSON that Python reads as infinity: stored, it broke every read of the session.
    body = assert_refused(append(raw=raw), 400, "number_out_of_range")
    assert "finite" in body["detail"]
    sid = session["id"]
    # And a retry without an id stores nothing either (it used to store a duplicate).
    assert_refused(append(raw=raw), 400, "number_out_of_range")
    for path in ("events", "context", "usage"):
        assert alice_api.get(f"{SESSIONS}/{sid}/{path}").status_code == 200


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_it_refuses_non_standard_number_tokens_in_content(append, constant):
    raw = f'{{"type":"USER_MESSAGE","content":[{{"type":"text","text":"x","w":{constant}}}]}}'
    assert_refused(append(raw=raw), 400, "malformed_json")


@pytest.mark.profile_independent
def test_it_refuses_a_non_finite_number_a_python_caller_passes_to_the_service():
    from sessions_app.errors import InvalidInput
    from sessions_app.services import _content_for_storage

    with pytest.raises(InvalidInput) as refused:
        _content_for_storage({"n": [float("inf")]}, "content")
    assert refused.value.code == "number_out_of_range"
