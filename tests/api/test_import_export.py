"""import_session / export_session management commands."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from sessions_app import tokens
from sessions_app.models import Event, EventType, Session

MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the bug in parser.py — 日本語 🚀", "name": "alice"},
    {
        "role": "assistant",
        "content": "Let me read the files.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "parser.py"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "test.py"}'},
            },
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "def parse(s):\n    return s.split(',')\n",
    },
    {
        "role": "tool",
        "tool_call_id": "call_b",
        "name": "read_file",
        "content": "assert parse('a,b') == ['a', 'b']",
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_c",
                "type": "function",
                "function": {"name": "run_tests", "arguments": "{}"},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_c", "content": "1 passed"},
    {"role": "assistant", "content": "Fixed; the tests pass."},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def write_jsonl(path, messages, *, extra_lines=()):
    lines = [json.dumps(m, ensure_ascii=False) for m in messages]
    lines[1:1] = list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_import(path, **options):
    out, err = io.StringIO(), io.StringIO()
    call_command("import_session", str(path), stdout=out, stderr=err, **options)
    return out.getvalue().strip(), err.getvalue()


def run_export(session_id, *args):
    out, err = io.StringIO(), io.StringIO()
    call_command("export_session", str(session_id), *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_it_imports_a_conversation(alice, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", MESSAGES)
    session_id, err = run_import(path, user="alice", model="gpt-4o", title="Imported")
    session = Session.objects.get(pk=session_id)
    assert session.owner == alice
    assert session.title == "Imported"
    assert session.context_limit == 128_000
    events = list(Event.objects.filter(session=session).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, 12))
    assert [e.type for e in events] == [
        EventType.SYSTEM_PROMPT,
        EventType.USER_MESSAGE,
        EventType.AGENT_MESSAGE,
        EventType.TOOL_CALL,
        EventType.TOOL_CALL,
        EventType.TOOL_RESULT,
        EventType.TOOL_RESULT,
        EventType.TOOL_CALL,
        EventType.TOOL_RESULT,
        EventType.AGENT_MESSAGE,
        EventType.USER_MESSAGE,
    ]
    call = events[3]
    assert (call.name, call.tool_call_id, call.content) == (
        "read_file",
        "call_a",
        '{"path": "parser.py"}',
    )
    assert events[5].tool_call_id == "call_a"
    assert events[1].name == "alice"
    assert events[10].content_is_json
    # Counted exactly, like any other append.
    counter = tokens.counter_for_model("gpt-4o")
    assert events[1].token_count == tokens.message_tokens(
        counter, role="user", content=MESSAGES[1]["content"], name="alice"
    )
    assert session.event_count == 11
    assert session.context_tokens == sum(e.token_count for e in events) + 3
    # The progress bar and the summary go to stderr.
    assert "11/11" in err
    assert "Imported 11 events" in err


def test_it_round_trips_import_and_export(alice, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", MESSAGES)
    session_id, _ = run_import(path, user="alice", model="claude-3.5-sonnet")
    out = tmp_path / "out.jsonl"
    run_export(session_id, "--out", str(out))
    exported = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert exported == MESSAGES
    stdout, _ = run_export(session_id)
    assert [json.loads(line) for line in stdout.splitlines()] == MESSAGES
    # And once more: the export imports to the same ledger.
    again, _ = run_import(out, user="alice", model="claude-3.5-sonnet")
    first = list(
        Event.objects.filter(session_id=session_id)
        .order_by("seq")
        .values_list("type", "content", "name", "tool_call_id", "token_count")
    )
    second = list(
        Event.objects.filter(session_id=again)
        .order_by("seq")
        .values_list("type", "content", "name", "tool_call_id", "token_count")
    )
    assert first == second


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "JSON object"),
        ('{"role": "robot", "content": "x"}', "unknown role"),
        ('{"role": "user", "content": 5}', "content"),
        ('{"role": "user"}', "needs content"),
        ('{"role": "tool", "content": "x"}', "tool_call_id"),
        ('{"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]}', "tool_calls[0]"),
        ('{"role": "user", "content": "a\\u0000b"}', "NUL"),
        ('{"role": "user", "content": "\\ud800"}', "surrogate"),
    ],
)
def test_it_refuses_a_bad_line_and_stores_nothing(alice, tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "chat.jsonl", MESSAGES, extra_lines=[bad_line])
    with pytest.raises(CommandError) as excinfo:
        run_import(path, user="alice", model="gpt-4o")
    assert "line 2" in str(excinfo.value)
    assert message in str(excinfo.value)
    assert not Session.objects.exists()
    assert not Event.objects.exists()


def test_it_refuses_an_unknown_user_or_model(alice, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", MESSAGES)
    with pytest.raises(CommandError, match="no user"):
        run_import(path, user="nobody", model="gpt-4o")
    with pytest.raises(CommandError, match="unknown model"):
        run_import(path, user="alice", model="my-llm")
    assert not Session.objects.exists()
    session_id, _ = run_import(path, user="alice", model="my-llm", context_limit=4096)
    assert Session.objects.get(pk=session_id).context_limit == 4096


def test_it_imports_in_batches(alice, tmp_path):
    messages = [
        {"role": "user" if i % 2 else "assistant", "content": f"message {i}"} for i in range(23)
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", messages)
    session_id, _ = run_import(path, user="alice", model="gpt-4o", batch_size=5)
    assert list(
        Event.objects.filter(session_id=session_id)
        .order_by("seq")
        .values_list("content", flat=True)
    ) == [m["content"] for m in messages]
    assert Session.objects.get(pk=session_id).last_seq == 23


def test_it_exports_only_active_events_unless_asked(alice, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", MESSAGES)
    session_id, _ = run_import(path, user="alice", model="gpt-4o")
    session = Session.objects.get(pk=session_id)
    summary = Event.objects.create(
        session=session,
        seq=12,
        type=EventType.COMPACTION,
        content="Summary: bug fixed.",
        token_count=8,
    )
    Event.objects.filter(session=session, seq__in=[2, 3, 4, 5, 6, 7]).update(compacted_by=summary)
    Event.objects.create(
        session=session, seq=13, type=EventType.LOCAL_SYSTEM_MESSAGE, content="note", token_count=3
    )

    active = [json.loads(line) for line in run_export(session_id)[0].splitlines()]
    # The order /context sends: system prompt, summary, kept events.
    assert active == [
        MESSAGES[0],
        {"role": "system", "content": "Summary: bug fixed."},
        MESSAGES[5],
        MESSAGES[6],
        MESSAGES[7],
        MESSAGES[8],
    ]
    everything = [
        json.loads(line) for line in run_export(session_id, "--include-compacted")[0].splitlines()
    ]
    assert everything == MESSAGES


def test_it_refuses_an_unknown_session(db):
    with pytest.raises(CommandError, match="no session"):
        run_export("00000000-0000-0000-0000-000000000000")
    with pytest.raises(CommandError, match="no session"):
        run_export("nope")


def test_it_exports_the_active_context_in_the_order_context_sends_it(alice_api):
    from compaction_app import services
    from tests.support.helpers import SYSTEM_PROMPT, append_events, coding_turns, create_session

    session_id = create_session(alice_api, limit=8000)
    append_events(alice_api, session_id=session_id, events=coding_turns(count=8))
    run = services.compaction_request(
        session=Session.objects.get(pk=session_id), user=None, strategy="summarize", enqueue=False
    )
    assert services.compaction_execute(run_id=run.pk).status == "completed"

    sent = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    exported = [json.loads(line) for line in run_export(session_id)[0].splitlines()]
    # The export keeps each tool message's name (import reads it back); the API has no such field.
    assert [{k: v for k, v in m.items() if k != "name"} for m in exported] == sent["messages"]
    # System prompt, summary, kept events.
    assert exported[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert exported[1] == {"role": "system", "content": sent["summary"]}
    assert all(m["role"] != "system" for m in exported[2:])


@pytest.mark.django_db(transaction=True)
def test_it_leaves_no_compaction_pending_after_an_import_past_the_threshold(
    alice, alice_api, tmp_path, settings, request
):
    from tests.support.helpers import request_compaction, wait_for_run

    in_memory_broker = settings.CELERY_BROKER_URL.startswith("memory://")
    if not in_memory_broker:
        request.getfixturevalue("worker")  # production: the server's workers take the run
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(40):
        messages += [
            {"role": "user", "content": f"Please fix bug {turn} in src/module_{turn}.py"},
            {"role": "assistant", "content": f"Fixed bug {turn}: KeyError in handler_{turn}."},
        ]
    counter = tokens.counter_for_model("gpt-4o")
    context_tokens = 3 + sum(
        tokens.message_tokens(counter, role=m["role"], content=m["content"]) for m in messages
    )
    path = write_jsonl(tmp_path / "chat.jsonl", messages)
    # Lands at 84 %: above the compact threshold, below the hard limit.
    limit = int(context_tokens / 0.84)
    session_id, err = run_import(path, user="alice", model="gpt-4o", context_limit=limit)

    runs = alice_api.get(f"/api/v1/sessions/{session_id}/compactions").json()["results"]
    assert [r["trigger"] for r in runs] == ["auto"]
    # The command's in-memory broker dies with it: the run happened in the command.
    run = runs[0] if in_memory_broker else wait_for_run(alice_api, run_id=runs[0]["id"])
    assert run["status"] == "completed", run
    assert run["tokensBefore"] == context_tokens
    if in_memory_broker:
        assert "Compaction (auto, summarize) ran in this process: completed" in err
    # Nothing is left pending, so the next compaction is accepted.
    request_compaction(alice_api, session_id=session_id, strategy="trim")
