"""One number, one meaning, on every surface (the scope rule, sessions_app/scope.py).

One gateway session with two threads, a retried call, a failed call, a call to a model with
no price, a compaction, a compaction that folds nothing and a revert. Then each figure is read
from REST, the websocket, the dashboard's HTML, MCP and the admin, and each surface must show
the same value for it: context figures are the main thread's, bill figures the whole
session's (every thread, every call the provider answered, retries included), failures
counted apart, the cost the known sum beside the calls with no price.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from websockets.sync.client import connect

from compaction_app.realtime import messages
from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Call, Session, Thread
from sessions_app.pricing import usd_text
from tests.support import mcp_live
from tests.support.gateway_live import openai_client, token_for, wait_until
from tests.support.helpers import wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = {"role": "system", "content": "You are a coding agent. Keep answers short."}
UNPRICED = "acme-house-model-7"


def _turn(number: int) -> dict[str, str]:
    return {
        "role": "user",
        "content": f"Step {number}: read src/module_{number}.py and list its functions. "
        + "Context line. " * 30,
    }


def _reply(number: int) -> Step:
    return Step(
        text=f"src/module_{number}.py defines parse_{number}(), render_{number}() and "
        f"check_{number}(); exit code 0 after 0.{number} s. " + "Detail. " * 40,
        prompt_tokens=400 + 10 * number,
        cache_read_tokens=100,
    )


def _drain(socket: Any, session_id: str, *, quiet: float = 1.5) -> list[dict[str, Any]]:
    """Every message for the session until the socket has been quiet for `quiet` seconds."""
    received = []
    while True:
        try:
            message = json.loads(socket.recv(timeout=quiet))
        except TimeoutError:
            return received
        if message.get("sessionId") == session_id:
            received.append(message)


def _text(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert found is not None, f"#{element_id} is not on the page"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", found.group(1))).strip()


def _count(value: int) -> str:
    return f"{value:,}"


def test_it_shows_each_figure_the_same_on_every_surface(
    gateway_url, upstream, worker, alice, alice_api
):
    token = token_for(alice)
    main = openai_client(
        gateway_url, key=token, session="one-number", **{"X-Ledger-Thread": "main"}
    )
    side = openai_client(gateway_url, key=token, session="one-number")
    with connect(f"{gateway_url.replace('http', 'ws', 1)}/ws/sessions/?token={token}") as socket:
        # The main thread: five turns, then the same request sent again (a retry the provider
        # answers and bills a second time; the ledger keeps one reply).
        history: list[dict[str, str]] = [SYSTEM]
        for number in range(5):
            upstream.script(_reply(number))
            history.append(_turn(number))
            reply = main.chat.completions.create(model="gpt-4o", messages=history)
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
        upstream.script(_reply(4))
        main.chat.completions.create(model="gpt-4o", messages=history[:-1])
        # A second thread (a side call with instructions of its own).
        upstream.script(Step(text="Module survey", prompt_tokens=30))
        side.chat.completions.create(
            model="gpt-4o",
            messages=[
                {"role": "system", "content": "Title this."},
                {"role": "user", "content": "x"},
            ],
        )
        # A call the provider fails (counted apart, billed nothing).
        upstream.script(Step(kind="error", status=500))
        with pytest.raises(Exception):  # noqa: B017 - the SDK's InternalServerError
            main.chat.completions.create(model="gpt-4o", messages=[*history, _turn(9)])
        # A call to a model without a price: its tokens count, its cost is unknown.
        upstream.script(Step(text="Done.", prompt_tokens=900))
        history.append(_turn(5))
        raw = main.chat.completions.with_raw_response.create(model=UNPRICED, messages=history)
        headers = raw.headers
        session = Session.objects.get(client_key="one-number")
        wait_until(lambda: Call.objects.filter(session=session).count() == 9)

        # A compaction of the main thread, one that folds nothing, and a revert of the first.
        created = alice_api.post(
            f"/api/v1/sessions/{session.pk}/compactions", {"strategy": "summarize"}, format="json"
        ).json()
        compacted = wait_for_run(alice_api, run_id=created["id"])
        assert compacted["status"] == "completed" and compacted["foldedCount"] > 0
        created = alice_api.post(
            f"/api/v1/sessions/{session.pk}/compactions", {"strategy": "trim"}, format="json"
        ).json()
        noop = wait_for_run(alice_api, run_id=created["id"])
        assert noop["outcome"] == "nothing_to_fold"
        reverted = alice_api.post(f"/api/v1/compactions/{compacted['id']}/revert")
        assert reverted.status_code == 200, reverted.content
        pushed = _drain(socket, str(session.pk))

    session.refresh_from_db()
    threads = {t.key: t for t in Thread.objects.filter(session=session)}
    assert len(threads) == 2

    # --- REST ----------------------------------------------------------------------------------
    usage = alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    calls = alice_api.get(f"/api/v1/sessions/{session.pk}/calls").json()["summary"]
    every_call = alice_api.get("/api/v1/calls").json()["summary"]
    # The scope rule itself: the main thread's context, the whole session's bill.
    assert usage["scope"] == {"context": "thread", "thread": "main", "bill": "session"}
    assert usage["contextTokens"] == threads["main"].context_tokens
    assert usage["totalPromptTokens"] == sum(t.prompt_tokens for t in threads.values())
    assert usage["totalCompletionTokens"] == sum(t.completion_tokens for t in threads.values())
    assert (usage["calls"], usage["failedCalls"], usage["unpricedCalls"]) == (8, 1, 1)
    assert UNPRICED in usage["costUnknownReason"] and usage["costUsd"] > 0
    # The calls ledger is the same bill, call by call.
    for figures in (calls, every_call):
        assert (figures["calls"], figures["errors"]) == (9, 1)
        assert figures["promptTokens"] == usage["totalPromptTokens"]
        assert figures["completionTokens"] == usage["totalCompletionTokens"]
        assert figures["cachedInputTokens"] == usage["cachedInputTokens"]
        assert figures["costUsd"] == pytest.approx(usage["costUsd"], abs=1e-9)
        assert figures["unpricedCalls"] == usage["unpricedCalls"]
    # The response headers of the main thread's last call: what the thread's context says.
    assert int(headers["X-Ledger-Context-Tokens"]) == usage["contextTokens"]
    assert float(headers["X-Ledger-Percent-Used"]) == usage["percentUsed"]
    # The runs: the same before / after wherever a run is shown.
    runs = {
        r["id"]: r
        for r in alice_api.get(f"/api/v1/sessions/{session.pk}/compactions").json()["results"]
    }

    # --- websocket: every message is a declared one; the last usage is REST's ----------------
    for message in pushed:
        assert messages.parse(message).to_json() == message
    assert [m for m in pushed if m["type"] == "USAGE_UPDATED"][-1]["usage"] == usage
    completes = {m["compactionId"]: m for m in pushed if m["type"] == "COMPACTION_COMPLETE"}
    for run_id, message in completes.items():
        assert (message["tokensBefore"], message["tokensAfter"]) == (
            runs[run_id]["tokensBefore"],
            runs[run_id]["tokensAfter"],
        )
    assert completes[noop["id"]]["outcome"] == "nothing_to_fold"
    assert completes[noop["id"]]["message"].startswith("Nothing to fold")
    (revert,) = [m for m in pushed if m["type"] == "COMPACTION_REVERTED"]
    assert revert["compactionId"] == compacted["id"]

    # --- MCP -------------------------------------------------------------------------------------
    mcp_usage = mcp_live.payload(
        mcp_live.call(gateway_url, token, "ledger_usage", session=str(session.pk))
    )
    mcp_usage.pop("session")
    mcp_usage.pop("thresholds")
    assert mcp_usage == usage
    listed = mcp_live.payload(mcp_live.call(gateway_url, token, "ledger_sessions"))["sessions"]
    (row,) = [s for s in listed if s["id"] == str(session.pk)]
    assert (row["contextTokens"], row["percentUsed"]) == (
        usage["contextTokens"],
        usage["percentUsed"],
    )

    # --- dashboard HTML --------------------------------------------------------------------------
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/sessions/{session.pk}/").content.decode()
    assert _text(page, "ctx-tokens") == _count(usage["contextTokens"])
    assert f'class="ring-text">{usage["percentUsed"]}%<' in page
    assert "main thread" in _text(page, "ctx-scope")
    assert _text(page, "reported-prompt") == _count(usage["totalPromptTokens"])
    assert _text(page, "reported-completion") == _count(usage["totalCompletionTokens"])
    assert _text(page, "reported-total") == _count(usage["totalTokens"])
    assert _text(page, "cost-usd") == usd_text(usage["costUsd"])
    assert _text(page, "cost-unpriced") == "+ 1 call with no price"
    assert (_text(page, "billed-calls"), _text(page, "failed-calls")) == ("8", "1")
    schedule = re.search(r'id="tokens-to-compact">([\d,]+)<', page)
    level = session.window_level(usage["contextTokens"])
    if schedule:  # auto compaction on: "in N tokens", from the same context figure
        assert schedule.group(1) == _count(level.tokens_to_compact)
    for run_id, run in runs.items():
        row_html = re.search(rf'<tr id="run-{run_id}".*?</tr>', page, re.S)
        assert row_html is not None
        assert f"{_count(run['tokensBefore'])} → {_count(run['tokensAfter'])}" in row_html.group(0)
    # The latest completed run that stands folded nothing: the loss panel says so.
    assert "the latest compaction (trim" in page and "folded nothing" in page
    assert "no completed compaction yet" not in page
    listing = browser.get("/").content.decode()
    row_html = re.search(rf'<tr id="row-{session.pk}".*?</tr>', listing, re.S)
    assert row_html is not None
    row_text = row_html.group(0)
    assert f'class="pct">{usage["percentUsed"]} %<' in row_text
    assert f'class="ctx">{_count(usage["contextTokens"])}<' in row_text
    assert f">{_count(usage['totalTokens'])}</td>" in row_text
    assert f'class="cost">{usd_text(usage["costUsd"])}<' in row_text
    assert "+ 1 call with no price" in row_text
    calls_page = browser.get(f"/sessions/{session.pk}/calls/").content.decode()
    assert _text(calls_page, "sum-calls") == "9"
    assert _text(calls_page, "sum-cost").startswith(usd_text(usage["costUsd"]))
    assert "+ 1 call with no price" in _text(calls_page, "sum-cost")

    # --- admin -----------------------------------------------------------------------------------
    from django.contrib.auth import get_user_model

    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser(username="root", password="x"))
    change = admin.get(f"/admin/sessions_app/session/{session.pk}/change/").content.decode()
    assert (
        f"{_count(usage['contextTokens'])} / {_count(usage['contextLimit'])} "
        f"({usage['percentUsed']}%) · thread main"
    ) in change
    assert (
        f"{_count(usage['totalPromptTokens'])} prompt + "
        f"{_count(usage['totalCompletionTokens'])} completion = "
        f"{_count(usage['totalTokens'])} tokens · {usd_text(usage['costUsd'])} + 1 call with no price"
    ) in change
    runs_list = admin.get(f"/admin/compaction_app/compactionrun/?q={session.pk}").content.decode()
    assert f"{_count(runs[compacted['id']]['tokensBefore'])} → " in runs_list
    assert f"{_count(runs[noop['id']]['tokensBefore'])} (nothing to fold)" in runs_list
