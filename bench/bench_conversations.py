"""Conversation benchmark: how many of the facts of whole agent conversations survive a
compaction, per scenario and path, and how much context each path leaves.

    .venv/bin/python bench/bench_conversations.py [--split tune|sealed] [--tokens 400000]
        [--paths rest,clear,gateway,messages] [--seed 1] [--gateway-model gpt-4o]

The corpus is `tests/fixtures/conversations/` (compaction_app/testkit/conversations.py): ten
hand-written agent sessions (an SRE incident, a dbt mismatch, a Gradle build, a TypeScript
refactor, a security review, a design thread, a research agent, a Python fix, a Terraform
apply, a Go panic), each with the facts a person continuing the work must know, grown by
`long_session()` to `--tokens` tokens by routine calls of the same tools between the
scenario's turns. `--split`: the half measured (`SPLIT`); `tune` by default, the sealed half
only on purpose. A fact is kept when its text, blanks collapsed, is in what the model would
be sent next (message contents and tool-call arguments).

Runs in a child process on the embedded profile against a throwaway SQLite file (as
`bench_evidence.py` does), with a real Celery worker thread, daphne serving the app in a
thread and the provider stand-in (compaction_app/testkit/provider_standin.py) as the
gateway's OpenAI upstream.

- REST (`rest`): the session appended over the API to a gpt-4.1 session (1,000,000-token
  window), `POST /compactions` (`summarize` + `local`, keepRecentEvents 2) at the auto
  summary budget (16,384 in that window), at maxSummaryTokens 8,192 and at 2,000; the facts
  are counted in `GET /context`, the ratio is its tokenCount over the context before.
- Clear (`clear`): the same sessions, `POST /compactions` with `clear_tool_results`: every
  older output replaced by its placeholder (its verdicts and the records the conversation
  points at), the newest outputs kept whole within the room (at most a fifth of what was
  cleared, outside the call path). The path the gateway takes when clearing alone reaches its
  mark: on this corpus's many small outputs it never does, so this is where it is measured.
- Gateway (`gateway`): the whole conversation sent as one Chat Completions request (the
  official `openai` SDK) for gpt-4o, whose window is 128k: the gateway records it, fits it in
  the call path with the session's defaults (it compacts once down to fitTargetRatio 0.5 of
  the window: clearing old tool results when that reaches the mark, else `summarize` +
  `local`) and forwards it; the facts are counted in the request the stand-in received, the
  ratio is the run's tokens after over before. The strategy the gateway chose is printed.
- Messages (`messages`): the same through the Messages wire as Claude Code sends it (the
  official `anthropic` SDK, system blocks with cache breakpoints, tool_use / tool_result
  blocks) for claude-sonnet-4-5, whose window is 200k; the facts in the Messages body the
  stand-in received.

Each cell: facts kept / facts · context after / before · the summary's tokens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from harness import django_child, run_embedded_child

ROOT = Path(__file__).resolve().parent.parent
# This checkout's compaction_app first (the venv may have another checkout installed).
sys.path.insert(0, str(ROOT))
ROW_MARKER = "BENCH_ROWS "
REST_LIMIT = 1_000_000
REST_MODEL = "gpt-4.1"
# `--gateway-model`: gpt-4.1's 1M window with `--tokens 900000` is where clearing alone
# reaches the mark on this corpus (what a session with `strategy: clear_tool_results` gets).
GATEWAY_MODEL = "gpt-4o"
BUDGETS: tuple[int | None, ...] = (None, 8192, 2000)
PATHS = ("rest", "clear", "gateway", "messages")
MESSAGES_MODEL = "claude-sonnet-4-5"
CHUNK = 2_000


def messages_text(messages: list[dict[str, Any]]) -> str:
    """What a model reads in Chat Completions messages: contents (strings or text parts) and
    the arguments of tool calls."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, dict)]
        for call in message.get("tool_calls") or []:
            parts.append(call.get("function", {}).get("arguments", ""))
    return "\n".join(parts)


def _label(budget: int | None) -> str:
    return "rest auto" if budget is None else f"rest {budget}"


def _child(split: str, tokens: int, paths: list[str], seed: int) -> dict[str, Any]:
    user, token = django_child()
    from bench_compaction import _client, _compact, _ingest
    from celery.contrib.testing.worker import start_worker
    from django.conf import settings

    from compaction_app.models import CompactionRun
    from compaction_app.testkit.conversations import facts_kept, load_scenarios, long_session
    from config.celery import app

    client = _client(token)
    scenarios = load_scenarios(split=split)
    # cells[label][scenario] = {"kept": [...], "before": n, "after": n, "summary": n, ...}
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    sessions = {s.name: long_session(s, tokens=tokens, seed=seed) for s in scenarios}

    runs: list[tuple[str, int | None, str]] = []
    if "rest" in paths:
        runs += [(_label(budget), budget, "summarize") for budget in BUDGETS]
    if "clear" in paths:
        runs.append(("rest clear", None, "clear_tool_results"))
    if runs:
        with start_worker(app, perform_ping_check=False, pool="solo", loglevel="WARNING"):
            for label, budget, strategy in runs:
                cells[label] = {}
                started = time.perf_counter()
                for scenario in scenarios:
                    events = sessions[scenario.name]
                    # The API takes at most API_MAX_EVENTS_PER_REQUEST (5,000) events a call.
                    session_id = _ingest(
                        client,
                        json.dumps(events[:CHUNK]),
                        f"{scenario.name}-{label}",
                        {"keepRecentEvents": 2, "maxSummaryTokens": budget},
                        context_limit=REST_LIMIT,
                    )
                    for start in range(CHUNK, len(events), CHUNK):
                        response = client.post(
                            f"/api/v1/sessions/{session_id}/events",
                            data=json.dumps(events[start : start + CHUNK]),
                            content_type="application/json",
                        )
                        assert response.status_code == 201, response.content[:500]
                    request = {"strategy": strategy}
                    if strategy == "summarize":
                        request["summarizer"] = "local"
                    created, complete, _ = _compact(token, session_id, request)
                    assert complete["success"], complete
                    response = client.get(f"/api/v1/sessions/{session_id}/context?format=openai")
                    assert response.status_code == 200, response.content[:500]
                    context = response.json()
                    run = CompactionRun.objects.get(pk=created["id"])
                    cells[label][scenario.name] = {
                        "kept": facts_kept(messages_text(context["messages"]), scenario.facts),
                        "before": complete["tokensBefore"],
                        "after": context["tokenCount"],
                        "summary": run.summary_tokens or 0,
                        "strategy": run.strategy,
                    }
                seconds[label] = time.perf_counter() - started

    wires = [path for path in ("gateway", "messages") if path in paths]
    if wires:
        from compaction_app.testkit.daphne_thread import serve_in_thread
        from compaction_app.testkit.provider_standin import ProviderStandIn

        standin = ProviderStandIn().start()
        settings.LEDGER_OPENAI_UPSTREAM = standin.openai_url
        settings.LEDGER_ANTHROPIC_UPSTREAM = standin.anthropic_url
        try:
            with start_worker(app, perform_ping_check=False, pool="solo", loglevel="WARNING"):
                _, base_url = serve_in_thread()
                for wire in wires:
                    cells[wire] = {}
                    started = time.perf_counter()
                    for scenario in scenarios:
                        cells[wire][scenario.name] = _through_gateway(
                            token, base_url, standin, sessions[scenario.name], scenario, wire=wire
                        )
                        standin.requests.clear()
                    seconds[wire] = time.perf_counter() - started
        finally:
            standin.close()
    from compaction_app.policy import summary_bound

    auto = summary_bound(context_limit=REST_LIMIT, max_summary_tokens=None)
    return {"cells": cells, "seconds": seconds, "auto": auto}


def _through_gateway(
    token: str,
    base_url: str,
    standin: Any,
    events: list[dict[str, Any]],
    scenario: Any,
    *,
    wire: str = "gateway",
) -> dict[str, Any]:
    """The whole conversation as one request through the gateway: Chat Completions (the
    official `openai` SDK, `gateway`) or Messages as Claude Code sends it (the official
    `anthropic` SDK, `messages`); the facts in what it forwarded, and its run's figures."""
    import anthropic
    import openai

    from compaction_app.gateway import after
    from compaction_app.models import CompactionRun, Trigger
    from compaction_app.testkit.conversations import chat_messages, facts_kept
    from compaction_app.testkit.tool_output_session import anthropic_request, anthropic_text
    from sessions_app.models import Session

    key = f"conv-{wire}-{scenario.name}"
    headers = {"X-Ledger-Key": token, "X-Ledger-Session": key}
    if wire == "messages":
        client = anthropic.Anthropic(
            api_key="sk-ant-bench-not-a-key",
            base_url=f"{base_url}/gateway/anthropic",
            default_headers=headers,
            max_retries=0,
            timeout=600,
        )
        system, messages = anthropic_request(events)
        raw = client.messages.with_raw_response.create(
            model=MESSAGES_MODEL, max_tokens=1024, system=system, messages=messages
        )
    else:
        gateway = openai.OpenAI(
            api_key="sk-bench-not-a-key",
            base_url=f"{base_url}/gateway/openai/v1",
            default_headers=headers,
            max_retries=0,
            timeout=600,
        )
        raw = gateway.chat.completions.with_raw_response.create(
            model=GATEWAY_MODEL, messages=chat_messages(events)
        )
    after.wait_idle(timeout=120)
    session = Session.objects.get(client_key=key)
    runs = list(CompactionRun.objects.filter(session=session, trigger=Trigger.GATEWAY))
    body = standin.requests[-1].body
    forwarded = int(raw.headers.get("X-Ledger-Context-Tokens", 0))
    run = runs[-1] if runs else None
    before = (run.tokens_before if run else None) or forwarded
    text = anthropic_text(body) if wire == "messages" else messages_text(body["messages"])
    return {
        "kept": facts_kept(text, scenario.facts),
        "before": before,
        "after": forwarded,
        "summary": sum(r.summary_tokens or 0 for r in runs),
        "strategy": ", ".join(f"{r.strategy} ({r.status})" for r in runs) or "none",
        "window": session.context_limit,
        "compacted": raw.headers.get("X-Ledger-Compacted"),
    }


def _run_child(split: str, tokens: int, paths: list[str], seed: int) -> dict[str, Any]:
    args = ["--split", split, "--tokens", str(tokens), "--paths", ",".join(paths)]
    args += ["--gateway-model", GATEWAY_MODEL]
    args += ["--seed", str(seed)]
    payload, failure = run_embedded_child(script=__file__, args=args, timeout=3600)
    if failure is not None:
        raise SystemExit(f"benchmark child {failure}")
    return payload


def _report(result: dict[str, Any], split: str) -> str:
    from compaction_app.testkit.conversations import load_scenarios

    cells = result["cells"]
    auto = result["auto"]
    headings = {
        "rest auto": f"REST, auto ({auto:,})",
        "rest 8192": "REST, 8,192",
        "rest 2000": "REST, 2,000",
        "rest clear": "REST, clear tool results",
        "gateway": f"Gateway, {GATEWAY_MODEL}",
        "messages": f"Gateway Messages, {MESSAGES_MODEL}",
    }
    labels = [label for label in headings if label in cells]
    scenarios = [s for s in load_scenarios(split=split)]
    lines = [
        f"### {split} half: {len(scenarios)} conversations, "
        f"{sum(len(s.facts) for s in scenarios)} facts",
        "",
        "Each cell: facts kept / facts · context after / before · summary tokens.",
        "",
        "| scenario | facts | " + " | ".join(headings[label] for label in labels) + " |",
        "|---|---:|" + "---:|" * len(labels),
    ]
    for scenario in scenarios:
        row = []
        for label in labels:
            cell = cells[label][scenario.name]
            ratio = cell["after"] / cell["before"] if cell["before"] else 0.0
            row.append(
                f"{len(cell['kept'])}/{len(scenario.facts)} · {ratio:.1%} · {cell['summary']:,}"
            )
        lines.append(f"| {scenario.name} | {len(scenario.facts)} | {' | '.join(row)} |")
    total_facts = sum(len(s.facts) for s in scenarios)
    row = []
    for label in labels:
        kept = sum(len(cells[label][s.name]["kept"]) for s in scenarios)
        before = sum(cells[label][s.name]["before"] for s in scenarios)
        after = sum(cells[label][s.name]["after"] for s in scenarios)
        summary = sum(cells[label][s.name]["summary"] for s in scenarios) / len(scenarios)
        row.append(
            f"**{kept}/{total_facts} = {kept / total_facts:.1%}** · {after / before:.1%} · "
            f"{summary:,.0f} (mean)"
        )
    lines.append(f"| **all** | {total_facts} | {' | '.join(row)} |")
    for wire in ("gateway", "messages"):
        if wire not in cells:
            continue
        strategies = sorted({c["strategy"] for c in cells[wire].values()})
        windows = sorted({c["window"] for c in cells[wire].values()})
        lines += [
            "",
            f"{headings[wire]} runs: {'; '.join(strategies)} "
            f"(window {', '.join(f'{w:,}' for w in windows)}).",
        ]
    before = [cells[labels[0]][s.name]["before"] for s in scenarios] if labels else []
    if before:
        lines.append(
            f"Context before (REST count, {REST_MODEL}): {min(before):,} … {max(before):,} tokens."
        )
    timing = ", ".join(f"{label} {s:.0f} s" for label, s in result["seconds"].items())
    lines.append(f"Time per path: {timing}.")
    if split == "tune":
        for label in labels:
            lost = [
                f"{s.name}: `{fact}`"
                for s in scenarios
                for fact in s.facts
                if fact not in cells[label][s.name]["kept"]
            ]
            if lost:
                lines += ["", f"Lost ({headings[label]}): " + "; ".join(lost)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Context Ledger conversation benchmark.")
    parser.add_argument(
        "--split",
        choices=("tune", "sealed"),
        default="tune",
        help="the half of the corpus to measure (the sealed half only on purpose)",
    )
    parser.add_argument("--tokens", type=int, default=400_000, help="each session's size")
    parser.add_argument(
        "--paths",
        default="rest,clear,gateway,messages",
        help="any of rest, clear, gateway, messages",
    )
    parser.add_argument("--seed", type=int, default=1, help="the routine's seed")
    parser.add_argument(
        "--gateway-model", default="gpt-4o", help="the Chat Completions path's model"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global GATEWAY_MODEL
    GATEWAY_MODEL = args.gateway_model
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = set(paths) - set(PATHS)
    if unknown or not paths:
        parser.error(f"--paths takes {', '.join(PATHS)}, not {args.paths!r}")
    if args.child:
        payload = _child(args.split, args.tokens, paths, args.seed)
        print(ROW_MARKER + json.dumps(payload), flush=True)
        return 0
    started = time.perf_counter()
    result = _run_child(args.split, args.tokens, paths, args.seed)
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"Context Ledger conversation benchmark — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}, "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}{load}), "
        f"Python {platform.python_version()}, embedded profile, split {args.split}, "
        f"{args.tokens:,} tokens a session, seed {args.seed}, total "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(_report(result, args.split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
