"""Evidence benchmarks: which facts of real tools' output survive a compaction, per path (REST
summarize, the gateway on Chat Completions, the gateway on Anthropic Messages), per tool family
and per half of the corpus; which of an agent's own conclusions survive in a prose-heavy
session; and whether summarize stays linear in the session's size.

    .venv/bin/python bench/bench_evidence.py [--split tune|sealed|all] [--outputs N]
        [--repeats 3] [--no-linear]

`--split`: the half of the corpus measured (`tests/fixtures/tool_outputs/SPLIT`); `tune` by
default, so the sealed half is only looked at on purpose; `all` prints both halves, each in its
own table. `--outputs N`: only the half's first N outputs, for a quick look (the figures need
all). `--no-linear`: skip the linearity runs (the slowest part).

Runs in a child process on the embedded profile against a throwaway SQLite file (as
`bench_compaction.py` does), with a real Celery worker thread, daphne serving the app in a
thread and the provider stand-in (compaction_app/testkit/provider_standin.py) as the gateway's
OpenAI and Anthropic upstream.

1. Facts kept per tool family: the hand-written corpus `tests/fixtures/tool_outputs/` (each
   output with the facts written beside it), four outputs buried apart in a session of 200
   routine tool results (`compaction_app/testkit/tool_output_session.py`), at two summary
   budgets: 4,000 tokens (the auto budget of a 200k window) and 2,000. A fact is kept when it
   is in the text of what the model would see next.
   - REST: the events appended over the API, `POST /compactions` (`summarize` + `local`,
     keepRecentEvents 2, maxSummaryTokens auto in a 200k window, then 2,000), then the text
     of `GET /context`.
   - Gateway, Chat Completions: the same session sent by the official `openai` SDK to the
     gateway (`/gateway/openai/v1`), then the window set so that the session plus its closing
     question lands between `compactThreshold` and the hard limit, and the question sent: the
     gateway compacts in the call path (`summarize` + `local`, maxSummaryTokens 4,000 or
     2,000) and the facts are counted in the messages it forwards to the stand-in.
     `fitTargetRatio` is 0.1: with the default 0.5, clearing the old tool results alone
     reaches the mark, so the gateway clears them instead of summarizing (no summary: each
     placeholder keeps its output's most salient lines, the rest stays in the ledger for
     search and recall); that default fit is measured too, in its own column.
   - Gateway, Messages: the same through the official `anthropic` SDK (`/gateway/anthropic`)
     as Claude Code sends it: two system blocks with `cache_control` breakpoints, tool calls
     as `tool_use` blocks, results as `tool_result` blocks, and the moving breakpoint on the
     last user message; the facts are counted in the system blocks and messages forwarded.
2. Facts kept in prose: `compaction_app/testkit/prose_gen.py`'s sessions (seeds 1-3), whose
   facts are the agent's conclusions worded without decision words, compacted over REST
   (`summarize` + `local`, keepRecentEvents 2) at the auto budget and at 2,000.
3. Linearity: `summarize` + `local` with default settings on `session_gen.py`'s session at 1×
   (≈ 235k tokens) and 4× (≈ 940k tokens) the history, from `POST /compactions` to
   `COMPACTION_COMPLETE` on the websocket, best of `--repeats` runs each; the figure is the
   4× time per token over the 1× time per token (target ≤ 1.2).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness import django_child, run_embedded_child

ROOT = Path(__file__).resolve().parent.parent
ROW_MARKER = "BENCH_ROWS "
LIMIT = 200_000
GROUP = 4
BUDGETS: tuple[int | None, ...] = (None, 2000)
# The share of facts each half must keep at each budget: the tune half the figures selection
# was tuned to, the sealed half the figure it must reach on outputs it was not tuned on.
TARGETS = {"tune": {None: 0.95, 2000: 0.85}, "sealed": {None: 0.90, 2000: 0.90}}
PROSE_SEEDS = (1, 2, 3)
LINEAR_TARGET = 1.2
MODEL = "gpt-4.1"
CLAUDE = "claude-sonnet-4-5"
# The gateway's window puts the session, once its closing question is added, between
# compactThreshold (0.8) and the hard limit (0.95).
GATEWAY_FILL = 0.88
# Below what clearing the old tool results leaves (~7k of a ~59k window): the gateway
# summarizes. None: the session's default (0.5), where it clears them instead.
GATEWAY_TARGET = 0.1
# The gateway's window is a quarter of the REST one, so its auto budget would be smaller:
# the REST path's auto budget is given explicitly.
GATEWAY_BUDGETS = {None: 4000, 2000: 2000}
WIRES = ("chat", "messages")


def _child(repeats: int, outputs: int, split: str, linear: bool) -> dict[str, Any]:
    user, token = django_child()
    from bench_compaction import _client, _compact, _context_text, _ingest
    from celery.contrib.testing.worker import start_worker
    from django.conf import settings

    from compaction_app.testkit.daphne_thread import serve_in_thread
    from compaction_app.testkit.prose_gen import generate_prose_session
    from compaction_app.testkit.provider_standin import ProviderStandIn
    from compaction_app.testkit.session_gen import generate_session
    from compaction_app.testkit.tool_output_session import buried_session, facts_kept, load_corpus
    from config.celery import app

    client = _client(token)
    halves = ("tune", "sealed") if split == "all" else (split,)
    # Each half buried on its own: a session never mixes a tuned output with a sealed one.
    groups: list[list[Any]] = []
    for half in halves:
        corpus = load_corpus(split=half)[:outputs]
        groups += [corpus[k : k + GROUP] for k in range(0, len(corpus), GROUP)]
    # kept[label][fixture name] = the facts kept
    kept: dict[str, dict[str, list[str]]] = defaultdict(dict)
    prose: dict[str, dict[int, list[str]]] = defaultdict(dict)
    timing: dict[str, list[float]] = {}

    def rest(events: list[dict[str, Any]], title: str, budget: int | None) -> str:
        session_id = _ingest(
            client,
            json.dumps(events),
            title,
            {"keepRecentEvents": 2, "maxSummaryTokens": budget},
            context_limit=LIMIT,
        )
        _, complete, _seconds = _compact(
            token, session_id, {"strategy": "summarize", "summarizer": "local"}
        )
        assert complete["success"], complete
        return _context_text(client, session_id)[0]

    standin = ProviderStandIn().start()
    settings.LEDGER_OPENAI_UPSTREAM = standin.openai_url
    settings.LEDGER_ANTHROPIC_UPSTREAM = standin.anthropic_url
    try:
        with start_worker(app, perform_ping_check=False, pool="solo", loglevel="WARNING"):
            for budget in BUDGETS:
                label = "rest auto" if budget is None else f"rest {budget}"
                for k, group in enumerate(groups):
                    text = rest(buried_session(group, routine=200), f"evidence-{label}-{k}", budget)
                    for fixture in group:
                        kept[label][fixture.name] = facts_kept(text, fixture.facts)
                for seed in PROSE_SEEDS:
                    session = generate_prose_session(seed=seed)
                    text = rest(session.events, f"prose-{label}-{seed}", budget)
                    prose[label][seed] = facts_kept(text, session.facts)
            if linear:
                for name, turns, target_tokens in (("1x", 125, 235_000), ("4x", 500, 940_000)):
                    generated = generate_session(turns=turns, seed=7, target_tokens=target_tokens)
                    body = json.dumps(generated.events)
                    runs = []
                    for k in range(repeats):
                        session_id = _ingest(client, body, f"linear-{name}-{k}", {})
                        _, complete, seconds = _compact(
                            token, session_id, {"strategy": "summarize", "summarizer": "local"}
                        )
                        assert complete["success"], complete
                        runs.append((seconds, complete["tokensBefore"]))
                    best = min(runs)
                    timing[name] = [best[0], best[1], *[r[0] for r in runs]]
            # The gateway last: its server thread and calls are no part of the timings above.
            _, base_url = serve_in_thread()
            runs_: list[tuple[str, int | None, float | None]] = [
                (str(GATEWAY_BUDGETS[b]), GATEWAY_BUDGETS[b], GATEWAY_TARGET) for b in BUDGETS
            ]
            runs_.append(("default", None, None))
            for wire in WIRES:
                for suffix, budget, target in runs_:
                    label = f"{wire} {suffix}"
                    for k, group in enumerate(groups):
                        text = _through_gateway(
                            token,
                            base_url,
                            standin,
                            buried_session(group, routine=200),
                            wire=wire,
                            name=f"{label}-{k}",
                            budget=budget,
                            target=target,
                        )
                        for fixture in group:
                            kept[label][fixture.name] = facts_kept(text, fixture.facts)
                        standin.requests.clear()
    finally:
        standin.close()
    return {"kept": dict(kept), "prose": dict(prose), "timing": timing}


def _through_gateway(
    token: str,
    base_url: str,
    standin: Any,
    events: list[dict[str, Any]],
    *,
    wire: str,
    name: str,
    budget: int | None,
    target: float | None,
) -> str:
    """Send `events` to the gateway as an agent would (on `wire`: `chat` or `messages`), make
    its closing question cross the compaction threshold, and return the text of what the
    gateway forwarded upstream."""
    from bench_compaction import _client

    from compaction_app.gateway import after
    from compaction_app.models import CompactionRun, Trigger
    from sessions_app.models import Session
    from sessions_app.threads import main_thread

    # The day's work, recorded as the gateway records any call; the closing question
    # (`What is the state now?`) comes once the window is set.
    send, follow_up = (_chat_wire if wire == "chat" else _messages_wire)(
        base_url, token, name, events
    )
    send()
    after.wait_idle(timeout=60)
    session = Session.objects.get(client_key=name)
    tokens = main_thread(session=session).context_tokens
    settings: dict[str, Any] = {
        "autoCompact": False,
        "refreshThresholdTokens": 100_000_000,
        "keepRecentEvents": 2,
        "maxSummaryTokens": budget,
    }
    if target is not None:
        settings["fitTargetRatio"] = target
    response = _client(token).patch(
        f"/api/v1/sessions/{session.pk}",
        data=json.dumps({"contextLimit": int(tokens / GATEWAY_FILL), "settings": settings}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content[:500]
    headers = follow_up(events[-2]["content"])
    assert headers["X-Ledger-Compacted"] == "true", dict(headers)
    after.wait_idle(timeout=60)
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)
    expected = "summarize" if target is not None else "clear_tool_results"
    assert (run.status, run.strategy) == ("completed", expected), (run.status, run.strategy)
    body = standin.requests[-1].body
    if wire == "messages":
        from compaction_app.testkit.tool_output_session import anthropic_text

        return anthropic_text(body)
    return "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))


def _chat_wire(base_url: str, token: str, name: str, events: list[dict[str, Any]]) -> Any:
    """(send the history, send the closing question) on Chat Completions."""
    import openai

    from compaction_app.testkit.tool_output_session import chat_messages

    gateway = openai.OpenAI(
        api_key="sk-bench-not-a-key",
        base_url=f"{base_url}/gateway/openai/v1",
        default_headers={"X-Ledger-Key": token, "X-Ledger-Session": name},
        max_retries=0,
        timeout=300,
    )
    history = chat_messages(events[:-2])
    replies: list[Any] = []

    def send() -> None:
        replies.append(gateway.chat.completions.create(model=MODEL, messages=history))

    def follow_up(question: str) -> Any:
        history.append({"role": "assistant", "content": replies[0].choices[0].message.content})
        history.append({"role": "user", "content": question})
        raw = gateway.chat.completions.with_raw_response.create(model=MODEL, messages=history)
        return raw.headers

    return send, follow_up


def _messages_wire(base_url: str, token: str, name: str, events: list[dict[str, Any]]) -> Any:
    """(send the history, send the closing question) on Anthropic Messages, as Claude Code
    sends them: cache breakpoints on the system blocks and the last user message."""
    import anthropic

    from compaction_app.testkit.tool_output_session import EPHEMERAL, anthropic_request

    gateway = anthropic.Anthropic(
        api_key="sk-ant-bench-not-a-key",
        base_url=f"{base_url}/gateway/anthropic",
        default_headers={"X-Ledger-Key": token, "X-Ledger-Session": name},
        max_retries=0,
        timeout=300,
    )
    system, history = anthropic_request(events[:-2])
    tools = [
        {
            "name": "bash",
            "description": "Run a shell command and return its output.",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        }
    ]
    replies: list[Any] = []

    def create(raw: bool = False) -> Any:
        call = gateway.messages.with_raw_response.create if raw else gateway.messages.create
        return call(model=CLAUDE, max_tokens=1024, system=system, tools=tools, messages=history)

    def send() -> None:
        replies.append(create())

    def follow_up(question: str) -> Any:
        if history[-1]["role"] == "user":
            reply = [block.model_dump(exclude_none=True) for block in replies[0].content]
            history.append({"role": "assistant", "content": reply})
        # The breakpoint moves to the newest user message, as Claude Code moves it.
        for message in history:
            if message["role"] == "user":
                for block in message["content"]:
                    block.pop("cache_control", None)
        history.append(
            {
                "role": "user",
                "content": [{"type": "text", "text": question, "cache_control": EPHEMERAL}],
            }
        )
        return create(raw=True).headers

    return send, follow_up


def _run_child(repeats: int, outputs: int, split: str, linear: bool) -> dict[str, Any]:
    args = ["--repeats", str(repeats), "--outputs", str(outputs), "--split", split]
    if not linear:
        args.append("--no-linear")
    payload, failure = run_embedded_child(script=__file__, args=args, timeout=3600)
    if failure is not None:
        raise SystemExit(f"benchmark child {failure}")
    return payload


# (label, heading, budget for the target; None: no target)
COLUMNS: tuple[tuple[str, str, int | None, bool], ...] = (
    ("rest auto", "REST, auto (4,000)", None, True),
    ("rest 2000", "REST, 2,000", 2000, True),
    ("chat 4000", "Chat, 4,000", None, True),
    ("chat 2000", "Chat, 2,000", 2000, True),
    ("chat default", "Chat, default fit (clears)", None, False),
    ("messages 4000", "Messages, 4,000", None, True),
    ("messages 2000", "Messages, 2,000", 2000, True),
    ("messages default", "Messages, default fit (clears)", None, False),
)


def _half_table(result: dict[str, Any], half: str) -> tuple[list[str], bool]:
    """One half's table: facts kept per family and path, the totals against the half's
    targets; for the tune half, the facts lost."""
    from compaction_app.testkit.tool_output_session import load_corpus

    kept = result["kept"]
    corpus = [f for f in load_corpus(split=half) if f.name in kept.get("rest auto", {})]
    families: dict[str, list[Any]] = defaultdict(list)
    for fixture in corpus:
        families[fixture.family].append(fixture)
    columns = [c for c in COLUMNS if c[0] in kept]
    lines = [
        f"### {half} half: {len(corpus)} outputs, {sum(len(f.facts) for f in corpus)} facts",
        "",
        "| tool family | outputs | " + " | ".join(c[1] for c in columns) + " |",
        "|---|---:|" + "---:|" * len(columns),
    ]

    def share(fixtures: list[Any], label: str) -> tuple[int, int]:
        found = sum(len(kept[label].get(f.name, [])) for f in fixtures)
        return found, sum(len(f.facts) for f in fixtures)

    for family in sorted(families):
        cells = ["{}/{}".format(*share(families[family], c[0])) for c in columns]
        lines.append(f"| {family} | {len(families[family])} | {' | '.join(cells)} |")
    ok = True
    cells = []
    for label, _, budget, targeted in columns:
        found, total = share(corpus, label)
        ratio = found / total if total else 0.0
        if targeted:
            target = TARGETS[half][budget]
            good = ratio >= target
            ok = ok and good
            cells.append(
                f"**{found}/{total} = {ratio:.1%}** (≥ {target:.0%} {'✅' if good else '❌'})"
            )
        else:
            cells.append(f"**{found}/{total} = {ratio:.1%}**")
    lines.append(f"| **all** | {len(corpus)} | {' | '.join(cells)} |")
    if half == "tune":
        for label, heading, _, _ in columns:
            lost = [
                f"{f.name}: `{fact}`"
                for f in corpus
                for fact in f.facts
                if fact not in kept[label].get(f.name, [])
            ]
            if lost:
                lines += ["", f"Lost ({heading}): " + "; ".join(lost)]
    return lines, ok


def _report(result: dict[str, Any], split: str) -> tuple[str, bool]:
    ok = True
    lines: list[str] = []
    for half in ("tune", "sealed") if split == "all" else (split,):
        table, good = _half_table(result, half)
        lines += [*table, ""]
        ok = ok and good
    lines += [
        "Default fit: the gateway with the default fitTargetRatio (0.5) clears the old tool "
        "results instead of summarizing, each placeholder keeping its output's most salient "
        "lines; the facts not in what it forwards stay in the ledger (search, recall).",
        "",
        "### Prose-heavy sessions (prose_gen.py): the agent's conclusions kept, REST summarize",
        "",
        "| seed | facts | REST, auto | REST, 2,000 |",
        "|---:|---:|---:|---:|",
    ]
    from compaction_app.testkit.prose_gen import generate_prose_session

    prose = result["prose"]
    totals = {"rest auto": [0, 0], "rest 2000": [0, 0]}
    lost: list[str] = []
    for seed in PROSE_SEEDS:
        facts = generate_prose_session(seed=seed).facts
        cells = []
        for label in totals:
            found = prose[label][str(seed)]
            totals[label][0] += len(found)
            totals[label][1] += len(facts)
            cells.append(f"{len(found)}/{len(facts)}")
            lost += [f"seed {seed}, {label}: `{f}`" for f in facts if f not in found]
        lines.append(f"| {seed} | {len(facts)} | {' | '.join(cells)} |")
    cells = []
    for found, total in totals.values():
        good = found == total
        ok = ok and good
        cells.append(f"**{found}/{total}** (all {'✅' if good else '❌'})")
    lines.append(f"| **all** | {totals['rest auto'][1]} | {' | '.join(cells)} |")
    if lost:
        lines += ["", "Lost: " + "; ".join(lost)]
    timing = result["timing"]
    if timing:
        one, four = timing["1x"], timing["4x"]
        per_one = one[0] / one[1]
        per_four = four[0] / four[1]
        ratio = per_four / per_one
        linear = ratio <= LINEAR_TARGET
        ok = ok and linear
        lines += [
            "",
            "| history | tokens | POST /compactions → COMPACTION_COMPLETE (best; all runs) | µs per token |",
            "|---|---:|---:|---:|",
            f"| 1× | {one[1]:,} | {one[0]:.2f} s ({', '.join(f'{t:.2f}' for t in one[2:])}) | {per_one * 1e6:.2f} |",
            f"| 4× | {four[1]:,} | {four[0]:.2f} s ({', '.join(f'{t:.2f}' for t in four[2:])}) | {per_four * 1e6:.2f} |",
            f"| 4× / 1× per token | | | **{ratio:.2f}×** (≤ {LINEAR_TARGET} {'✅' if linear else '❌'}) |",
        ]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Context Ledger evidence benchmarks.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--outputs", type=int, default=1_000, help="corpus outputs to bury, per half"
    )
    parser.add_argument(
        "--split",
        choices=("tune", "sealed", "all"),
        default="tune",
        help="the half of the corpus to measure (the sealed half only on purpose)",
    )
    parser.add_argument("--no-linear", action="store_true", help="skip the linearity runs")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        payload = _child(args.repeats, args.outputs, args.split, not args.no_linear)
        print(ROW_MARKER + json.dumps(payload), flush=True)
        return 0
    started = time.perf_counter()
    result = _run_child(args.repeats, args.outputs, args.split, not args.no_linear)
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"Context Ledger evidence benchmarks — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}, "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}{load}), "
        f"Python {platform.python_version()}, embedded profile, split {args.split}, total "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    table, ok = _report(result, args.split)
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
