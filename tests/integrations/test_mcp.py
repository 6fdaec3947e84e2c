"""The MCP server at /mcp, driven by the official `mcp` client over Streamable HTTP against the
live server (both profiles): tools, resources, auth, permissions and errors."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from asgiref.sync import async_to_sync
from mcp.shared.exceptions import MCPError

from compaction_app.models import CompactionRun, RunStatus
from compaction_app.services import compaction_execute, compaction_request
from sessions_app.models import Event, Session
from tests.support.gateway_live import token_for
from tests.support.helpers import append_events, asgi_http_scope, create_session
from tests.support.mcp_live import call, payload, run

pytestmark = pytest.mark.django_db(transaction=True)

TOOL_NAMES = [
    "ledger_sessions",
    "ledger_usage",
    "ledger_search",
    "ledger_recall",
    "ledger_compact",
    "ledger_pin",
]

# The tool output a compaction folds, and must come back verbatim.
MIGRATION_OUTPUT = (
    "Applying billing.0042_orders_archive_2025... FAILED\n"
    "django.db.utils.OperationalError: ERR_LOCK_TIMEOUT on table orders_archive_2025\n"
    "  exit code 17, took 31.4 s\n"
)


def coding_session(api, *, client_key: str | None = None) -> str:
    session_id = create_session(api, limit=1000)
    append_events(
        api,
        session_id=session_id,
        events=[
            {"type": "USER_MESSAGE", "content": "Run the billing migrations."},
            {
                "type": "TOOL_CALL",
                "name": "shell",
                "toolCallId": "call-1",
                "content": '{"cmd": "./manage.py migrate billing"}',
            },
            {
                "type": "TOOL_RESULT",
                "name": "shell",
                "toolCallId": "call-1",
                "content": MIGRATION_OUTPUT,
            },
            {"type": "AGENT_MESSAGE", "content": "The migration timed out on a lock."},
            {"type": "USER_MESSAGE", "content": "Retry it after the backup finishes."},
        ],
    )
    if client_key is not None:
        # What the gateway stores for `X-Ledger-Session: <client key>` (gateway/record.py).
        Session.objects.filter(pk=session_id).update(client_key=client_key)
    return session_id


def fold(session_id: str) -> CompactionRun:
    """Compact the session now (trim, so the tool call and its result are folded)."""
    session = Session.objects.get(pk=session_id)
    run = compaction_request(
        session=session, user=None, strategy="trim", target_ratio=0.01, enqueue=False
    )
    run = compaction_execute(run_id=run.pk)
    assert run.status == RunStatus.COMPLETED, run.error
    assert Event.objects.get(session_id=session_id, seq=4).compacted_by_id is not None
    return run


def error_of(result) -> dict:
    assert result.is_error, result
    return payload(result)


# --- listing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_it_lists_the_ledger_tools_with_schemas_for_every_protocol_era(live_url, alice, mode):
    async def body(client):
        return await client.list_tools()

    tools = run(live_url, token_for(alice), body, mode=mode).tools
    assert [tool.name for tool in tools] == TOOL_NAMES
    for tool in tools:
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False
        assert len(tool.description) > 150, tool.name
    by_name = {tool.name: tool for tool in tools}
    assert by_name["ledger_search"].input_schema["required"] == ["query"]
    assert by_name["ledger_pin"].input_schema["required"] == ["seq"]
    assert by_name["ledger_usage"].annotations.read_only_hint is True
    assert by_name["ledger_compact"].annotations.read_only_hint is False


# --- auth ------------------------------------------------------------------------------------


def test_it_refuses_a_missing_or_wrong_token_with_rests_401(live_url, alice):
    missing = httpx.post(f"{live_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Token"
    assert missing.json() == {
        "error": "not_authenticated",
        "detail": "Authentication credentials were not provided.",
    }
    wrong = httpx.post(
        f"{live_url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Authorization": "Token not-a-token"},
    )
    assert wrong.status_code == 401
    assert wrong.json() == {"error": "authentication_failed", "detail": "Invalid token."}
    alice.is_active = False
    alice.save()
    inactive = httpx.post(
        f"{live_url}/mcp", json={}, headers={"Authorization": f"Bearer {token_for(alice)}"}
    )
    assert inactive.status_code == 401

    async def body(client):
        return await client.list_tools()

    # The official client gets no further than its first request.
    with pytest.raises(Exception, match="TaskGroup"):
        run(live_url, None, body)


def test_it_answers_401_before_reading_the_body(alice):
    """Driven at the ASGI level (daphne buffers a body before it calls the app): the app
    answers an unauthenticated request without ever asking for its body."""
    from config.asgi import application

    for headers in ([], [(b"authorization", b"Token not-a-token")]):
        scope = asgi_http_scope(
            "POST",
            "/mcp",
            [(b"content-type", b"application/json"), (b"content-length", b"50000000"), *headers],
        )
        sent: list[dict] = []

        async def receive() -> dict:
            raise AssertionError("the body was read")

        async def send(message: dict) -> None:
            sent.append(message)

        async_to_sync(application)(scope, receive, send)
        assert sent[0]["status"] == 401
        assert (b"www-authenticate", b"Token") in sent[0]["headers"]


@pytest.mark.parametrize(
    ("scheme", "mode"), [("Token", "auto"), ("Bearer", "legacy"), ("bearer", "auto")]
)
def test_it_takes_the_api_token_as_token_or_bearer_in_either_protocol_era(
    live_url, alice, alice_api, scheme, mode
):
    session_id = coding_session(alice_api)

    async def body(client):
        usage = await client.call_tool("ledger_usage", {})
        wrong = await client.call_tool("ledger_pin", {"seq": "two"})
        return usage, wrong

    usage, wrong = run(live_url, token_for(alice), body, scheme=scheme, mode=mode)
    assert not usage.is_error
    assert payload(usage)["session"]["id"] == session_id
    assert error_of(wrong)["fields"] == {"seq": "A valid integer is required."}


# --- each tool -------------------------------------------------------------------------------


def test_it_lists_the_callers_sessions_newest_activity_first_with_fill(
    live_url, alice, alice_api, bob_api
):
    older = coding_session(alice_api, client_key="thread-older")
    newer = create_session(alice_api, limit=2000)
    coding_session(bob_api)
    out = payload(call(live_url, token_for(alice), "ledger_sessions"))
    assert [row["id"] for row in out["sessions"]] == [newer, older]
    row = out["sessions"][1]
    assert row["clientKey"] == "thread-older"
    assert row["model"] == "gpt-4o"
    assert row["contextLimit"] == 1000
    assert row["events"] == 6
    assert row["percentUsed"] == round(100 * row["contextTokens"] / 1000, 1) > 0
    assert "owner" not in row
    assert [
        r["id"]
        for r in payload(call(live_url, token_for(alice), "ledger_sessions", limit=1))["sessions"]
    ] == [newer]


def test_it_reports_usage_of_the_named_or_latest_session(live_url, alice, alice_api):
    first = coding_session(alice_api, client_key="worker-7")
    latest = create_session(alice_api, limit=1000)
    rest = alice_api.get(f"/api/v1/sessions/{first}/usage").json()
    for name in (first, "worker-7"):
        out = payload(call(live_url, token_for(alice), "ledger_usage", session=name))
        assert out["session"]["id"] == first
        assert {key: out[key] for key in rest} == rest
        assert out["thresholds"] == {"compact": 0.8, "hardLimit": 0.95}
    assert payload(call(live_url, token_for(alice), "ledger_usage"))["session"]["id"] == latest
    # No provider call reported yet: nothing to pay, and nothing unknown about it.
    fresh = payload(call(live_url, token_for(alice), "ledger_usage"))
    assert fresh["costUsd"] == 0 and fresh["costUnknownReason"] is None
    append_events(
        alice_api,
        session_id=first,
        events=[
            {
                "type": "AGENT_MESSAGE",
                "content": "Done.",
                "tokenUsage": {"promptTokens": 1000, "completionTokens": 100, "totalTokens": 1100},
            }
        ],
    )
    billed = payload(call(live_url, token_for(alice), "ledger_usage", session=first))
    assert billed["totalPromptTokens"] == 1000
    assert billed["costUsd"] > 0


def test_it_searches_folded_events_and_recalls_the_exact_text_of_a_folded_tool_result(
    live_url, alice, alice_api
):
    session_id = coding_session(alice_api)
    fold(session_id)
    token = token_for(alice)
    found = payload(
        call(live_url, token, "ledger_search", session=session_id, query="ERR_LOCK_TIMEOUT")
    )
    assert [hit["seq"] for hit in found["results"]] == [4]
    hit = found["results"][0]
    assert hit["folded"] is True
    assert hit["type"] == "TOOL_RESULT"
    assert "**ERR_LOCK_TIMEOUT**" in hit["snippet"] and "<mark>" not in hit["snippet"]

    recalled = payload(
        call(live_url, token, "ledger_recall", session=session_id, seqs=[hit["seq"]])
    )
    by_seq = {event["seq"]: event for event in recalled["events"]}
    # The tool call travels with its result.
    assert sorted(by_seq) == [3, 4]
    assert by_seq[4]["content"] == MIGRATION_OUTPUT
    assert by_seq[4]["folded"] is True
    assert recalled["omitted"] == [] and recalled["missing"] == []

    by_query = payload(
        call(live_url, token, "ledger_recall", query="orders_archive_2025 exit code")
    )
    assert MIGRATION_OUTPUT in [event["content"] for event in by_query["events"]]


def test_it_plans_then_requests_a_compaction_and_reports_a_running_one(live_url, alice, alice_api):
    session_id = coding_session(alice_api)
    token = token_for(alice)
    plan = payload(
        call(live_url, token, "ledger_compact", dryRun=True, strategy="trim", targetRatio=0.01)
    )
    assert plan["dryRun"] is True
    assert plan["strategy"] == "trim"
    assert plan["eventsToFold"] > 0
    assert plan["tokensAfter"] < plan["tokensBefore"]
    assert not CompactionRun.objects.filter(session_id=session_id).exists()

    session = Session.objects.get(pk=session_id)
    pending = compaction_request(session=session, user=None, enqueue=False)
    busy = error_of(call(live_url, token, "ledger_compact", session=session_id))
    assert busy == {
        "error": "compaction_in_progress",
        "detail": "a compaction is already pending or running for this session",
        "compactionId": str(pending.pk),
        "status": 409,
    }


def test_it_queues_a_compaction_that_the_worker_completes(live_url, worker, alice, alice_api):
    session_id = coding_session(alice_api)
    out = payload(
        call(live_url, token_for(alice), "ledger_compact", strategy="trim", targetRatio=0.01)
    )
    run = out["compaction"]
    assert run["sessionId"] == session_id
    assert run["status"] == "pending"
    assert run["trigger"] == "manual"
    deadline = time.monotonic() + 30
    while CompactionRun.objects.get(pk=run["id"]).status not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert CompactionRun.objects.get(pk=run["id"]).status == "completed"
    usage = payload(call(live_url, token_for(alice), "ledger_usage"))
    assert usage["lastCompaction"] is not None


def test_it_pins_and_unpins_an_event_by_seq(live_url, alice, alice_api):
    session_id = coding_session(alice_api)
    token = token_for(alice)
    out = payload(call(live_url, token, "ledger_pin", seq=2))
    assert out == {
        "session": out["session"],
        "seq": 2,
        "type": "USER_MESSAGE",
        "pinned": True,
        "folded": False,
    }
    assert Event.objects.get(session_id=session_id, seq=2).pinned is True
    assert payload(call(live_url, token, "ledger_pin", seq=2, pinned=False))["pinned"] is False
    assert Event.objects.get(session_id=session_id, seq=2).pinned is False
    missing = error_of(call(live_url, token, "ledger_pin", seq=99))
    assert missing == {"error": "not_found", "detail": "event not found", "status": 404}


# --- resources -------------------------------------------------------------------------------


def test_it_serves_the_summary_and_loss_report_as_resources(live_url, alice, alice_api):
    session_id = coding_session(alice_api)
    token = token_for(alice)
    summary_uri = f"ledger://sessions/{session_id}/summary"
    loss_uri = f"ledger://sessions/{session_id}/loss-report"

    async def before(client):
        with pytest.raises(MCPError) as none_yet:
            await client.read_resource(summary_uri)
        return none_yet.value

    error = run(live_url, token, before)
    assert error.message == "this session has no summary yet"
    assert error.data["error"] == "no_summary" and error.data["status"] == 404

    append_events(
        alice_api,
        session_id=session_id,
        events=[
            {"type": "AGENT_MESSAGE", "content": f"Backup step {n} of 3 done."} for n in (1, 2, 3)
        ]
        + [{"type": "USER_MESSAGE", "content": "Now retry."}],
    )
    session = Session.objects.get(pk=session_id)
    summarized = compaction_execute(
        run_id=compaction_request(
            session=session, user=None, strategy="summarize", target_ratio=0.01, enqueue=False
        ).pk
    )
    assert summarized.status == RunStatus.COMPLETED, summarized.error

    async def after(client):
        listed = await client.list_resources()
        templates = await client.list_resource_templates()
        summary = await client.read_resource(summary_uri)
        loss = await client.read_resource(loss_uri)
        return listed, templates, summary, loss

    listed, templates, summary, loss = run(live_url, token, after)
    assert {r.uri for r in listed.resources} == {summary_uri, loss_uri}
    assert {t.uri_template for t in templates.resource_templates} == {
        "ledger://sessions/{session}/summary",
        "ledger://sessions/{session}/loss-report",
    }
    assert summary.contents[0].text == summarized.compaction_event.content
    report = json.loads(loss.contents[0].text)
    assert report["compactionId"] == str(summarized.pk)
    assert report["keptPercent"] == summarized.loss_report["keptPercent"]
    assert report["dropped"] == summarized.loss_report["dropped"]


# --- permissions -----------------------------------------------------------------------------


def test_it_keeps_bobs_session_from_alice_through_every_tool_and_resource(
    live_url, alice, bob, staff, alice_api, bob_api
):
    bobs = coding_session(bob_api, client_key="bobs-thread")
    fold(bobs)
    token = token_for(alice)
    not_found = {"error": "not_found", "detail": "session not found", "status": 404}
    calls = [
        ("ledger_usage", {}),
        ("ledger_search", {"query": "ERR_LOCK_TIMEOUT"}),
        ("ledger_recall", {"seqs": [4]}),
        ("ledger_recall", {"query": "ERR_LOCK_TIMEOUT"}),
        ("ledger_compact", {"dryRun": True}),
        ("ledger_compact", {}),
        ("ledger_pin", {"seq": 2}),
    ]
    # Alice has a session of her own, so omitting the session is no error.
    own = create_session(alice_api, limit=1000)
    append_events(alice_api, session_id=own, events=[{"type": "USER_MESSAGE", "content": "Hello."}])

    async def body(client):
        results = []
        for name in (bobs, "bobs-thread"):
            for tool, arguments in calls:
                results.append((tool, await client.call_tool(tool, {**arguments, "session": name})))
        for tool, arguments in calls:
            results.append((tool, await client.call_tool(tool, arguments)))
        listed = await client.call_tool("ledger_sessions", {})
        resources = await client.list_resources()
        errors = []
        for kind in ("summary", "loss-report"):
            for name in (bobs, "bobs-thread"):
                with pytest.raises(MCPError) as refused:
                    await client.read_resource(f"ledger://sessions/{name}/{kind}")
                errors.append(refused.value)
        return results, listed, resources, errors

    results, listed, resources, errors = run(live_url, token, body)
    for tool, result in results[: 2 * len(calls)]:
        assert error_of(result) == not_found, tool
    for tool, result in results[2 * len(calls) :]:
        # Her own latest session: nothing of bob's comes back.
        assert bobs not in result.content[0].text, tool
        assert "ERR_LOCK_TIMEOUT on table" not in result.content[0].text, tool
    assert bobs not in listed.content[0].text
    assert all(bobs not in r.uri for r in resources.resources)
    for error in errors:
        assert error.data["error"] == "not_found" and error.data["status"] == 404
    assert not Event.objects.filter(session_id=bobs, pinned=True).exists()
    assert not CompactionRun.objects.filter(session_id=bobs).exclude(strategy="trim").exists()

    # Staff see every session, by id and by anyone's client key.
    staff_token = token_for(staff)
    for name in (bobs, "bobs-thread"):
        out = payload(call(live_url, staff_token, "ledger_usage", session=name))
        assert out["session"]["id"] == bobs

    async def staff_reads(client):
        return await client.read_resource("ledger://sessions/bobs%2Dthread/loss-report")

    report = json.loads(run(live_url, staff_token, staff_reads).contents[0].text)
    assert report["sessionId"] == bobs
    listed = payload(call(live_url, staff_token, "ledger_sessions"))["sessions"]
    assert {row["owner"] for row in listed} == {"alice", "bob"}


# --- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("ledger_sessions", {"limit": 0}, "limit"),
        ("ledger_sessions", {"limit": "many"}, "limit"),
        ("ledger_usage", {"session": ["not", "a", "string"]}, "session"),
        ("ledger_usage", {"sesion": "typo"}, "sesion"),
        ("ledger_search", {}, "query"),
        ("ledger_search", {"query": "x" * 501}, "query"),
        ("ledger_search", {"query": "ok", "limit": 51}, "limit"),
        ("ledger_recall", {}, "query"),
        ("ledger_recall", {"query": "a", "seqs": [1]}, "query"),
        ("ledger_recall", {"seqs": [0]}, "seqs[0]"),
        ("ledger_recall", {"seqs": [2**70]}, "seqs[0]"),
        ("ledger_recall", {"seqs": [1], "maxTokens": 1001}, "maxTokens"),
        ("ledger_compact", {"strategy": "shred"}, "strategy"),
        ("ledger_compact", {"dryRun": "yes"}, "dryRun"),
        ("ledger_compact", {"targetRatio": 2}, "targetRatio"),
        ("ledger_pin", {}, "seq"),
        ("ledger_pin", {"seq": -1}, "seq"),
        ("ledger_pin", {"seq": 2, "pinned": "sure"}, "pinned"),
    ],
)
def test_it_answers_bad_arguments_with_a_tool_error_the_model_can_read(
    live_url, alice, alice_api, tool, arguments, field
):
    coding_session(alice_api)
    error = error_of(call(live_url, token_for(alice), tool, **arguments))
    # The codes REST answers for the same mistakes.
    assert error["error"] == ("unknown_strategy" if field == "strategy" else "invalid_request")
    assert error["status"] == 400
    assert field in error["fields"], error
    assert error["detail"]


def test_it_answers_an_unknown_tool_or_session_without_dropping_the_connection(live_url, alice):
    async def body(client):
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("ledger_delete_everything", {})
        none = await client.call_tool("ledger_usage", {})
        with pytest.raises(MCPError) as bad_uri:
            await client.read_resource("ledger://nowhere")
        # The connection still answers.
        tools = await client.list_tools()
        return unknown.value, none, bad_uri.value, tools

    unknown, none, bad_uri, tools = run(live_url, token_for(alice), body)
    assert "Unknown tool" in unknown.message
    assert error_of(none) == {
        "error": "not_found",
        "detail": "you have no sessions yet",
        "status": 404,
    }
    assert "Unknown resource" in bad_uri.message
    assert len(tools.tools) == len(TOOL_NAMES)


# --- the session page ------------------------------------------------------------------------


def test_it_shows_how_to_connect_an_agent_on_the_session_page(alice, alice_api, client):
    session_id = coding_session(alice_api, client_key="worker-7")
    client.force_login(alice)
    page = client.get(f"/sessions/{session_id}/").content.decode()
    assert (
        "claude mcp add --transport http ledger http://testserver/mcp "
        '--header "Authorization: Token &lt;API token&gt;"'
    ) in page
    assert (
        '[mcp_servers.ledger]\nurl = "http://testserver/mcp"\nbearer_token_env_var = "LEDGER_TOKEN"'
        in page
    )
    assert "MCPServerStreamableHttp(" in page
    assert '"url": "http://testserver/mcp"' in page
    assert "<code>worker-7</code>" in page
    # No API token is ever printed on the page.
    assert token_for(alice) not in page


def test_it_answers_a_bug_with_rests_internal_error_and_keeps_answering(
    live_url, alice, alice_api, monkeypatch
):
    from dataclasses import replace

    from compaction_app.mcp import tools

    def broken(user, arguments):
        raise RuntimeError("a bug")

    monkeypatch.setitem(
        tools.TOOLS_BY_NAME,
        "ledger_usage",
        replace(tools.TOOLS_BY_NAME["ledger_usage"], handler=broken),
    )
    coding_session(alice_api)

    async def body(client):
        return await client.call_tool("ledger_usage", {}), await client.call_tool(
            "ledger_sessions", {}
        )

    failed, after = run(live_url, token_for(alice), body)
    assert error_of(failed) == {
        "error": "internal_error",
        "detail": "An unexpected error occurred; it has been logged.",
        "status": 500,
    }
    assert not after.is_error


@pytest.mark.parametrize("name", ["%00", "bobs%00thread", "%ED%A0%80", "a%00"])
def test_it_answers_a_session_name_holding_nul_as_not_found(live_url, alice, alice_api, name):
    coding_session(alice_api)

    async def body(client):
        errors = []
        for kind in ("summary", "loss-report"):
            with pytest.raises(MCPError) as refused:
                await client.read_resource(f"ledger://sessions/{name}/{kind}")
            errors.append(refused.value)
        tool = await client.call_tool("ledger_usage", {"session": "a\x00b"})
        return errors, tool

    errors, tool = run(live_url, token_for(alice), body)
    for error in errors:
        assert error.code != -32603, error.message
        assert error.data["error"] == "not_found" and error.data["status"] == 404
    # A tool's argument is checked first: the same text is bad input there.
    assert error_of(tool)["status"] == 400
