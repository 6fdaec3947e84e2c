"""Real agent CLIs through the gateway: Claude Code (`@anthropic-ai/claude-code`), Codex
(`@openai/codex`) and Gemini CLI (`@google/gemini-cli`), the versions pinned in
tests/clients/package.json (installed by `npm ci` there; see docs/gateway.md), each run
non-interactively against daphne serving the app, with the provider stand-in scripting a tool
call, then a final answer.

Also the captures of what each CLI sends (tests/fixtures/clients/, taken with the stand-in as
the upstream): the gateway accepts them as they are.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from compaction_app.gateway import after
from compaction_app.testkit.provider_standin import GEMINI_SIGNATURE, Step
from sessions_app.models import Call, Event, Session
from tests.support.gateway_live import token_for

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = Path(__file__).parent.parent / "clients" / "node_modules" / ".bin"
CAPTURES = Path(__file__).parent.parent / "fixtures" / "clients"
CLAUDE = CLIENTS / "claude"
CODEX = CLIENTS / "codex"
GEMINI = CLIENTS / "gemini"
FAKE_PROVIDER_KEY = "sk-fake-provider-key-for-tests"
FINAL = "The notes say: remember the milk."


def _install_clients() -> None:
    """The test command sets up everything: the pinned CLIs come from the lock file with
    `npm ci` the first time (npm is the machine's; nothing is fetched but the registry's
    packages). Only when they are missing, and under a lock: CI runs the suite on both
    profiles at once, and two `npm ci` in one folder would delete each other's files."""
    folder = CLIENTS.parent.parent
    npm = shutil.which("npm")
    if npm is None:
        return
    with open(folder / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if CLAUDE.exists() and CODEX.exists() and GEMINI.exists():
            return
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=600,
            check=False,
        )


def _needs(binary: Path) -> None:
    if not binary.exists():
        _install_clients()
    if not binary.exists() or shutil.which("node") is None:
        pytest.skip(f"{binary.name} is not installed: run `npm ci` in tests/clients (needs node)")


def _base_env(home: Path) -> dict[str, str]:
    # Only what a CLI needs: no proxy settings, no real credentials from the environment.
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
    }


def _run(command: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a CLI non-interactively (no stdin) and expect exit code 0."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return done


def _events(client_key: str) -> list[Event]:
    session = Session.objects.get(client_key=client_key)
    return list(Event.objects.filter(session=session).order_by("seq"))


def test_it_runs_claude_code_through_a_tool_loop(gateway_url, upstream, alice, tmp_path):
    _needs(CLAUDE)
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.txt"
    notes.write_text("remember the milk\n")
    upstream.script(
        Step(
            text="",
            tool_calls=(("toolu_01", "Read", json.dumps({"file_path": str(notes)})),),
            thinking="The user wants the notes; read them.",
        ),
        Step(text=FINAL),
    )
    env = {
        **_base_env(tmp_path),
        "ANTHROPIC_BASE_URL": f"{gateway_url}/gateway/anthropic",
        "ANTHROPIC_API_KEY": FAKE_PROVIDER_KEY,
        "ANTHROPIC_CUSTOM_HEADERS": (
            f"X-Ledger-Key: {token_for(alice)}\nX-Ledger-Session: claude-run"
        ),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    done = _run(
        [
            str(CLAUDE),
            "-p",
            "What is in notes.txt?",
            "--output-format",
            "json",
            "--allowedTools",
            "Read",
        ],
        cwd=work,
        env=env,
    )
    result = json.loads(done.stdout)
    assert result["result"] == FINAL and not result["is_error"]

    calls = [r for r in upstream.requests if r.path == "/v1/messages"]
    assert len(calls) == 2
    # Forwarded as Claude Code sent it: its system blocks with their cache_control markers,
    # its mid-conversation system message, its beta headers and its own credential.
    first = calls[0]
    assert isinstance(first.body["system"], list)
    assert any("cache_control" in block for block in first.body["system"])
    assert "system" in [m["role"] for m in first.body["messages"]]
    assert first.headers["x-api-key"] == FAKE_PROVIDER_KEY
    assert "anthropic-beta" in first.headers
    assert not any(name.startswith("x-ledger") for name in first.headers)
    # The tool ran on the client and its result went back upstream.
    results = [
        block
        for message in calls[1].body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert results and results[0]["tool_use_id"] == "toolu_01"
    # Its thinking block went back with its signature (the API checks it).
    thinking = [
        block
        for message in calls[1].body["messages"]
        if message["role"] == "assistant" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "thinking"
    ]
    assert thinking and thinking[0]["signature"] == "sig-standin-0001"
    assert "remember the milk" in json.dumps(results[0]["content"])

    stored = _events("claude-run")
    types = [e.type for e in stored]
    # Every turn recorded once, in order: the system prompt, the user's turn, the
    # mid-conversation system message, the tool call, its result, the final answer.
    assert types[0] == "SYSTEM_PROMPT"
    assert types.count("TOOL_CALL") == 1 and types.count("TOOL_RESULT") == 1
    assert types.index("TOOL_CALL") < types.index("TOOL_RESULT")
    assert types[-1] == "AGENT_MESSAGE" and stored[-1].content == FINAL
    assert "SYSTEM_PROMPT" in types[2:]  # the mid-conversation one
    call = stored[types.index("TOOL_CALL")]
    assert (call.name, call.tool_call_id) == ("Read", "toolu_01")
    # The reply's thinking is kept (as JSON) with it, once.
    reasoning = stored[types.index("TOOL_CALL") - 1]
    assert reasoning.type == "AGENT_MESSAGE"
    assert json.loads(reasoning.content)[0]["signature"] == "sig-standin-0001"
    assert "remember the milk" in stored[types.index("TOOL_RESULT")].content
    assert len({e.id for e in stored}) == len(stored)


def _lines_until(stream, done) -> list[dict]:
    """Read Claude Code's stream-json output, one JSON object a line, until `done(line)`."""
    seen = []
    for raw in stream:
        line = json.loads(raw)
        seen.append(line)
        if done(line):
            return seen
    raise AssertionError(f"Claude Code ended before the awaited line: {seen[-3:]}")


def test_it_keeps_claude_codes_title_call_in_its_own_thread(
    gateway_url, upstream, alice, alice_api, tmp_path
):
    """Nonessential traffic on. `claude -p` alone makes no side call; the host's
    `generate_session_title` request (what the Agent SDK and the desktop app send over
    stream-json) makes Claude Code's title call, with its own instructions and one message."""
    _needs(CLAUDE)
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.txt"
    notes.write_text("remember the milk\n")
    upstream.script(
        Step(text="", tool_calls=(("toolu_01", "Read", json.dumps({"file_path": str(notes)})),)),
        Step(text=FINAL),
        Step(text='{"title": "Read the notes"}'),
    )
    env = {
        **_base_env(tmp_path),
        "ANTHROPIC_BASE_URL": f"{gateway_url}/gateway/anthropic",
        "ANTHROPIC_API_KEY": FAKE_PROVIDER_KEY,
        "ANTHROPIC_CUSTOM_HEADERS": (
            f"X-Ledger-Key: {token_for(alice)}\nX-Ledger-Session: claude-title"
        ),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    command = [str(CLAUDE), "-p", "--input-format", "stream-json", "--output-format"]
    command += ["stream-json", "--verbose", "--allowedTools", "Read"]
    with subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as claude:
        assert claude.stdin is not None and claude.stdout is not None

        def send(line: dict) -> None:
            assert claude.stdin is not None
            claude.stdin.write(json.dumps(line) + "\n")
            claude.stdin.flush()

        try:
            send(
                {
                    "type": "control_request",
                    "request_id": "init",
                    "request": {"subtype": "initialize"},
                }
            )
            question = {"role": "user", "content": "What is in notes.txt?"}
            send({"type": "user", "message": question, "parent_tool_use_id": None})
            result = _lines_until(claude.stdout, lambda line: line.get("type") == "result")[-1]
            assert result["result"] == FINAL and not result["is_error"]
            title = {"subtype": "generate_session_title", "description": "What is in notes.txt?"}
            send({"type": "control_request", "request_id": "title", "request": title})
            answer = _lines_until(
                claude.stdout,
                lambda line: (
                    line.get("type") == "control_response"
                    and line["response"].get("request_id") == "title"
                ),
            )[-1]
            assert answer["response"]["response"]["title"] == "Read the notes"
        finally:
            claude.stdin.close()
            claude.wait(timeout=60)

    calls = [r for r in upstream.requests if r.path == "/v1/messages"]
    assert len(calls) == 3
    side = calls[2].body
    assert len(side["messages"]) == 1 and "<session>" in json.dumps(side["messages"])
    assert not side.get("tools")
    session = Session.objects.get(client_key="claude-title")
    after.wait_idle()
    threads = alice_api.get(f"/api/v1/sessions/{session.pk}/threads").json()["results"]
    assert len(threads) == 2
    main, other = threads
    assert main["main"] is True and other["main"] is False
    main_events = alice_api.get(
        f"/api/v1/sessions/{session.pk}/events?thread={main['key']}&limit=200"
    ).json()["results"]
    types = [e["type"] for e in main_events]
    assert "TOOL_CALL" in types and "TOOL_RESULT" in types
    assert main_events[-1]["content"] == FINAL
    side_events = alice_api.get(
        f"/api/v1/sessions/{session.pk}/events?thread={other['key']}&limit=200"
    ).json()["results"]
    assert "<session>" in json.dumps([e["content"] for e in side_events])
    assert "TOOL_CALL" not in [e["type"] for e in side_events]
    assert side_events[-1]["content"] == '{"title": "Read the notes"}'


def test_it_runs_codex_through_a_tool_loop(gateway_url, upstream, alice, tmp_path):
    _needs(CODEX)
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("remember the milk\n")
    home = tmp_path / "codex-home"
    home.mkdir()
    # Codex's custom provider (config.toml `model_providers`): the gateway as base_url over
    # the Responses wire API, the ledger headers as static and environment-read headers.
    (home / "config.toml").write_text(
        'model = "gpt-5.5-codex"\n'
        'model_provider = "ledger"\n'
        "\n"
        "[model_providers.ledger]\n"
        'name = "Context Ledger gateway"\n'
        f'base_url = "{gateway_url}/gateway/openai/v1"\n'
        'env_key = "LEDGER_TEST_PROVIDER_KEY"\n'
        'wire_api = "responses"\n'
        'http_headers = { "X-Ledger-Session" = "codex-run" }\n'
        'env_http_headers = { "X-Ledger-Key" = "LEDGER_TEST_LEDGER_KEY" }\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
    upstream.script(
        Step(
            text="",
            tool_calls=(("call_01", "exec_command", json.dumps({"cmd": "cat notes.txt"})),),
            reasoning="gAAAA-opaque-reasoning",
        ),
        Step(text=FINAL),
    )
    env = {
        **_base_env(tmp_path),
        "CODEX_HOME": str(home),
        "LEDGER_TEST_PROVIDER_KEY": FAKE_PROVIDER_KEY,
        "LEDGER_TEST_LEDGER_KEY": token_for(alice),
    }
    last = tmp_path / "last-message.txt"
    _run(
        [
            str(CODEX),
            "exec",
            "--skip-git-repo-check",
            "--output-last-message",
            str(last),
            "What is in notes.txt?",
        ],
        cwd=work,
        env=env,
    )
    assert last.read_text().strip() == FINAL

    calls = [r for r in upstream.requests if r.path == "/v1/responses"]
    assert len(calls) == 2
    assert calls[0].headers["authorization"] == f"Bearer {FAKE_PROVIDER_KEY}"
    assert calls[0].body["store"] is False
    assert not any(name.startswith("x-ledger") for name in calls[0].headers)
    # Codex resends everything (store: false): the call, then its output.
    kinds = [item.get("type") for item in calls[1].body["input"]]
    assert kinds[-3:] == ["reasoning", "function_call", "function_call_output"]
    assert calls[1].body["input"][-3]["encrypted_content"] == "gAAAA-opaque-reasoning"
    output = calls[1].body["input"][-1]
    assert output["call_id"] == "call_01"

    stored = _events("codex-run")
    types = [e.type for e in stored]
    assert types.count("TOOL_CALL") == 1 and types.count("TOOL_RESULT") == 1
    assert types.index("TOOL_CALL") < types.index("TOOL_RESULT")
    assert types[-1] == "AGENT_MESSAGE" and stored[-1].content == FINAL
    call = stored[types.index("TOOL_CALL")]
    assert (call.name, call.tool_call_id) == ("exec_command", "call_01")
    # The reasoning item is kept (as JSON) with the reply it came with, once.
    reasoning = stored[types.index("TOOL_CALL") - 1]
    assert reasoning.type == "AGENT_MESSAGE"
    assert json.loads(reasoning.content)[0]["encrypted_content"] == "gAAAA-opaque-reasoning"
    assert "remember the milk" in stored[types.index("TOOL_RESULT")].content
    assert types.count("USER_MESSAGE") == [
        item.get("role") for item in calls[0].body["input"]
    ].count("user")


# Gemini CLI's router asks a small model to score the prompt (its `responseJsonSchema`); a
# low score sends the turn to the Flash model.
GEMINI_ROUTE = {"complexity_reasoning": "One file to read.", "complexity_score": 10}
GEMINI_SETTINGS = {
    # 0.61.0 reads GOOGLE_GEMINI_BASE_URL alone as its "gateway" auth type and then exits 41
    # ("Invalid auth method selected"): the API key method must be chosen in settings.
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


def test_it_runs_gemini_cli_through_a_tool_loop(
    gemini_gateway_url, upstream, alice, alice_api, tmp_path
):
    _needs(GEMINI)
    work = tmp_path / "work"
    work.mkdir()
    notes = work / "notes.txt"
    notes.write_text("remember the milk\n")
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
    upstream.script(
        Step(text=json.dumps(GEMINI_ROUTE)),
        Step(
            text="",
            tool_calls=(("call_01", "read_file", json.dumps({"file_path": str(notes)})),),
            thinking="The user wants the notes; read them.",
        ),
        Step(text=FINAL),
    )
    env = {
        **_base_env(tmp_path),
        "GOOGLE_GEMINI_BASE_URL": gemini_gateway_url,
        "GEMINI_API_KEY": FAKE_PROVIDER_KEY,
        # Comma-separated `Name: value` pairs.
        "GEMINI_CLI_CUSTOM_HEADERS": (
            f"X-Ledger-Key: {token_for(alice)}, X-Ledger-Session: gemini-run"
        ),
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    done = _run(
        [str(GEMINI), "-p", "What is in notes.txt?", "--yolo", "--output-format", "json"],
        cwd=work,
        env=env,
    )
    assert json.loads(done.stdout)["response"] == FINAL

    calls = [r for r in upstream.requests if "/models/" in r.path]
    assert len(calls) == 3
    routing, first, second = calls
    # The router's side call: a small model, a JSON schema, no tools, not streamed.
    assert routing.path.endswith(":generateContent")
    assert "responseJsonSchema" in routing.body["generationConfig"]
    assert "tools" not in routing.body
    # The turn itself, streamed over SSE, forwarded with the CLI's own key and no ledger header.
    assert first.path.startswith("/v1beta/models/") and first.query == "alt=sse"
    assert first.path.endswith(":streamGenerateContent")
    assert first.headers["x-goog-api-key"] == FAKE_PROVIDER_KEY
    assert not any(name.startswith("x-ledger") for name in first.headers)
    # The tool ran on the client; its call went back with its id and signature, its result
    # with the same id.
    model_turn, result_turn = second.body["contents"][-2:]
    assert model_turn["parts"][-1] == {
        "functionCall": {"id": "call_01", "name": "read_file", "args": {"file_path": str(notes)}},
        "thoughtSignature": GEMINI_SIGNATURE,
    }
    response = result_turn["parts"][0]["functionResponse"]
    assert response["id"] == "call_01" and "remember the milk" in json.dumps(response)

    session = Session.objects.get(client_key="gemini-run")
    after.wait_idle()
    threads = alice_api.get(f"/api/v1/sessions/{session.pk}/threads").json()["results"]
    assert len(threads) == 2
    main, side = threads
    assert main["main"] is True and side["main"] is False

    def events(thread: dict) -> list[dict]:
        url = f"/api/v1/sessions/{session.pk}/events?thread={thread['key']}&limit=200"
        return alice_api.get(url).json()["results"]

    main_events = events(main)
    types = [e["type"] for e in main_events]
    assert types.count("TOOL_CALL") == 1 and types.count("TOOL_RESULT") == 1
    assert types.index("TOOL_CALL") < types.index("TOOL_RESULT")
    assert types[-1] == "AGENT_MESSAGE" and main_events[-1]["content"] == FINAL
    assert "What is in notes.txt?" in json.dumps([e["content"] for e in main_events])
    assert "remember the milk" in main_events[types.index("TOOL_RESULT")]["content"]
    call = main_events[types.index("TOOL_CALL")]
    assert (call["name"], call["toolCallId"]) == ("read_file", "call_01")
    assert json.loads(call["content"]) == {"file_path": str(notes)}
    # The reply's thought summary (the CLI asks for them) is kept, with the call it came with.
    thought = main_events[types.index("TOOL_CALL") - 1]
    assert thought["type"] == "AGENT_MESSAGE" and thought["content"][0]["thought"] is True
    # The second turn resent the first: the stand-in's implicit cache shows on the reply.
    assert main_events[-1]["tokenUsage"]["cachedInputTokens"] > 0
    side_events = events(side)
    assert "TOOL_CALL" not in [e["type"] for e in side_events]
    assert json.loads(side_events[-1]["content"]) == GEMINI_ROUTE
    # Every call priced from its usageMetadata; the reply carries its usage.
    recorded = list(Call.objects.filter(session=session))
    assert len(recorded) == 3 and all(call.status == "ok" for call in recorded)
    assert all(call.prompt_tokens and call.cost_nano_usd for call in recorded)
    reply = Event.objects.filter(session=session, type="AGENT_MESSAGE").order_by("seq").last()
    assert reply is not None and reply.content == FINAL
    assert reply.prompt_tokens and reply.completion_tokens


@pytest.mark.parametrize(
    ("capture", "path"),
    [
        ("claude_code_2.1.328_first_request.json", "/gateway/anthropic/v1/messages"),
        ("codex_0.169.0_first_request.json", "/gateway/openai/v1/responses"),
        ("gemini_cli_0.61.0_routing_request.json", "/gateway/gemini"),
        ("gemini_cli_0.61.0_first_request.json", "/gateway/gemini"),
    ],
)
def test_it_accepts_what_each_cli_sends_as_it_is(
    request, gateway_url, upstream, alice, capture, path
):
    sent = json.loads((CAPTURES / capture).read_text())
    if path == "/gateway/gemini":
        # Gemini's path names the model and the method, the query `alt=sse` the framing.
        base = request.getfixturevalue("gemini_gateway_url").removeprefix(gateway_url)
        path = base + sent["path"] + (f"?{sent['query']}" if sent.get("query") else "")
    headers = {
        name: value
        for name, value in sent["headers"].items()
        if name not in ("content-length", "connection", "accept-encoding")
    }
    headers["x-ledger-key"] = token_for(alice)
    headers["x-ledger-session"] = f"capture-{capture}"
    response = httpx.post(f"{gateway_url}{path}", json=sent["body"], headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    forwarded = upstream.requests[-1]
    assert (forwarded.path, forwarded.query) == (sent["path"], sent.get("query", ""))
    assert forwarded.body == sent["body"]  # byte for byte (as JSON: the body was re-encoded)
    names = ("anthropic-beta", "anthropic-version", "x-codex-turn-metadata", "originator")
    for name in (*names, "x-goog-api-key", "x-goog-api-client"):
        if name in sent["headers"]:
            assert forwarded.headers[name] == sent["headers"][name]
    assert Event.objects.filter(session__client_key=f"capture-{capture}").exists()
