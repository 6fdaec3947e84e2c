"""Compaction benchmarks (issue 3): the end-to-end time of a `summarize` run with the `local`
summarizer on a ~940k-token session, and how many planted facts each strategy keeps in the
context it leaves. Prints one markdown table.

    .venv/bin/python bench/bench_compaction.py [--turns 500] [--seed 7]

Runs in a child process (Django reads its settings once per process) on the embedded profile
against a throwaway SQLite file in a temporary VAR_DIR; the dev database is never touched. The
child starts a real Celery worker thread (in-memory broker) and listens on the session's
websocket with a `WebsocketCommunicator`, exactly as a client of the service would.

Figures:
1. `summarize` + `local` with the session's default settings (maxSummaryTokens auto,
   keepRecentEvents 2): time from the `POST /compactions` request to `COMPACTION_COMPLETE`.
   Retention (2.) runs on two generators, `session_gen.py` and `realistic_gen.py`, with
   maxSummaryTokens auto / 256 / 2000, trim, and sumy's LexRank and TextRank given the auto
   budget; facts are judged by short keys found in the text of `GET /context`.
2. Fact retention: each strategy on a fresh copy of the session, set up to leave ≤ 40 % of
   the original tokens (summarize: keepRecentEvents 2 and each `--summary-tokens` value as
   maxSummaryTokens; trim: targetRatio = 0.4 × tokens / contextLimit, since targetRatio is a
   share of the limit; clear_tool_results: defaults); then `GET /context` and the share of
   planted facts found verbatim in the messages' text. User-stated facts stay in the context
   under every strategy but trim (summarize keeps user messages), so the summarize figure
   measures what the summary keeps of the agent-stated ones. Facts a summarize run lost are
   listed under the table with the event that stated them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import django_child, run_embedded_child

ROOT = Path(__file__).resolve().parent.parent
ROW_MARKER = "BENCH_ROWS "
BENCH_MODEL = "gpt-4.1"  # o200k_base, like the generator's calibration
CONTEXT_LIMIT = 1_000_000
# No auto-compaction or refresh during ingest: only the runs we request are measured.
BASE_SETTINGS = {"autoCompact": False, "refreshThresholdTokens": 100_000_000}
TARGET_SECONDS = 5.0
TARGET_RATIO = 0.40
TARGET_RETENTION = 0.90
# Summarize settings for the retention figure: fold everything but the newest two agent/tool
# events into a summary of at most N tokens (--summary-tokens); the user messages, which the
# strategy keeps, are ~2 % of the session, so any N up to tens of thousands lands ≤ 40 %.
KEEP_RECENT_EVENTS = 2
DEFAULT_SUMMARY_TOKENS = (256, 2000)

Row = dict[str, Any]


def _row(figure: str, value: str, target: str = "—", ok: bool | None = None) -> Row:
    return {"figure": figure, "value": value, "target": target, "ok": ok}


# --- child: runs inside the Django process ----------------------------------------------------


def _child(turns: int, seed: int, summary_tokens: list[int]) -> tuple[list[Row], list[str]]:
    user, token = django_child()
    from celery.contrib.testing.worker import start_worker

    from compaction_app.testkit.realistic_gen import generate_realistic_session
    from compaction_app.testkit.session_gen import generate_session
    from config.celery import app

    coding = generate_session(turns=turns, seed=seed, target_tokens=940_000)
    shell = generate_realistic_session()
    generators = [
        Generated(
            "session_gen", coding.events, coding.facts, coding.fact_events, [], CONTEXT_LIMIT
        ),
        Generated(
            "realistic_gen",
            shell.events,
            shell.facts,
            shell.fact_events,
            shell.stale,
            # Like the coding session, one that fills ~94 % of its window.
            int(shell.approx_tokens / 0.94 / 1000) * 1000,
        ),
    ]

    rows: list[Row] = []
    notes: list[str] = []
    with start_worker(app, perform_ping_check=False, pool="solo", loglevel="WARNING"):
        rows += _bench_summarize_time(token, json.dumps(coding.events))
        for generated in generators:
            retention_rows, retention_notes = _bench_retention(token, generated, summary_tokens)
            rows += retention_rows
            notes += retention_notes
    return rows, notes


@dataclass
class Generated:
    name: str
    events: list[dict[str, Any]]
    facts: list[str]
    fact_events: dict[str, int]
    stale: list[str]
    context_limit: int


def _client(token: str) -> Any:
    from django.test import Client

    return Client(HTTP_AUTHORIZATION=f"Token {token}")


def _ingest(
    client: Any,
    body: str,
    title: str,
    settings: dict[str, Any],
    context_limit: int = CONTEXT_LIMIT,
) -> str:
    response = client.post(
        "/api/v1/sessions",
        data=json.dumps(
            {
                "model": BENCH_MODEL,
                "title": title,
                "contextLimit": context_limit,
                "settings": {**BASE_SETTINGS, **settings},
            }
        ),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content[:500]
    session_id = response.json()["id"]
    response = client.post(
        f"/api/v1/sessions/{session_id}/events", data=body, content_type="application/json"
    )
    assert response.status_code == 201, response.content[:500]
    return session_id


def _compact(token: str, session_id: str, request: dict[str, Any]) -> tuple[dict, dict, float]:
    """POST /compactions while listening on the session's websocket; returns the run as
    created, the COMPACTION_COMPLETE message, and the seconds between request and message."""
    from asgiref.sync import async_to_sync, sync_to_async
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    client = _client(token)

    async def scenario() -> tuple[dict, dict, float]:
        feed = WebsocketCommunicator(
            application,
            f"/ws/sessions/{session_id}/?token={token}",
            headers=[(b"origin", b"http://testserver")],
        )
        connected, _ = await feed.connect(timeout=10)
        assert connected, "websocket refused"
        started = time.perf_counter()
        response = await sync_to_async(client.post)(
            f"/api/v1/sessions/{session_id}/compactions",
            data=json.dumps(request),
            content_type="application/json",
        )
        assert response.status_code == 202, response.content[:500]
        while True:
            message = await feed.receive_json_from(timeout=300)
            if message["type"] == "COMPACTION_COMPLETE":
                break
        elapsed = time.perf_counter() - started
        await feed.disconnect()
        return response.json(), message, elapsed

    return async_to_sync(scenario)()


def _bench_summarize_time(token: str, body: str) -> list[Row]:
    client = _client(token)
    session_id = _ingest(client, body, "summarize-time", {})
    _, complete, seconds = _compact(
        token, session_id, {"strategy": "summarize", "summarizer": "local"}
    )
    ok = complete["success"] and seconds < TARGET_SECONDS
    return [
        _row(
            "summarize + local, default settings: tokens before → after",
            f"{complete['tokensBefore']:,} → {complete['tokensAfter']:,} "
            f"({complete['eventsBefore']:,} → {complete['eventsAfter']:,} events)"
            if complete["success"]
            else f"failed: {complete['error']}",
            ok=complete["success"],
        ),
        _row(
            "summarize + local: POST /compactions → COMPACTION_COMPLETE on the websocket",
            f"{seconds:.2f} s",
            f"< {TARGET_SECONDS:.0f} s",
            ok,
        ),
    ]


def _context_text(client: Any, session_id: str) -> tuple[str, dict[str, Any]]:
    response = client.get(f"/api/v1/sessions/{session_id}/context?format=openai")
    assert response.status_code == 200, response.content[:500]
    context = response.json()
    parts = []
    for message in context["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif content is not None:
            parts.append(json.dumps(content))
    return "\n".join(parts), context


def _auto_budget(limit: int) -> int:
    from compaction_app.policy import summary_bound

    return summary_bound(context_limit=limit, max_summary_tokens=None)


def _bench_retention(
    token: str, generated: Generated, summary_tokens: list[int]
) -> tuple[list[Row], list[str]]:
    client = _client(token)
    body = json.dumps(generated.events)
    auto = _auto_budget(generated.context_limit)
    runs: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        (
            f"summarize + local, maxSummaryTokens auto (= {auto:,})",
            {"keepRecentEvents": KEEP_RECENT_EVENTS},
            {"strategy": "summarize", "summarizer": "local"},
        )
    ]
    runs += [
        (
            f"summarize + local, maxSummaryTokens {n:,}",
            {"keepRecentEvents": KEEP_RECENT_EVENTS, "maxSummaryTokens": n},
            {"strategy": "summarize", "summarizer": "local"},
        )
        for n in summary_tokens
    ]
    runs.append(("trim", {}, {"strategy": "trim"}))
    rows: list[Row] = []
    notes: list[str] = []
    prefix = f"{generated.name}: "
    for label, settings, request in runs:
        session_id = _ingest(
            client, body, f"retention-{label}", settings, context_limit=generated.context_limit
        )
        if request["strategy"] == "trim":
            # targetRatio is a share of the context *limit*; 40 % of the session's own tokens
            # is a smaller ratio of the limit.
            usage = client.get(f"/api/v1/sessions/{session_id}/usage").json()
            ratio_of_limit = TARGET_RATIO * usage["contextTokens"] / usage["contextLimit"]
            request = {**request, "targetRatio": int(ratio_of_limit * 10_000) / 10_000}
            label = f"trim, targetRatio {request['targetRatio']}"
        _, complete, seconds = _compact(token, session_id, request)
        if not complete["success"]:
            rows.append(_row(f"{prefix}{label}: run", f"failed: {complete['error']}", ok=False))
            continue
        text, context = _context_text(client, session_id)
        is_auto = "auto" in label
        rows += _retention_rows(
            prefix + label,
            generated,
            text,
            complete["tokensAfter"],
            complete["tokensBefore"],
            seconds,
            target=is_auto,
            kept_percent=complete.get("keptPercent"),
            summary=_summary_of(context),
        )
        kept = [fact for fact in generated.facts if fact in text]
        if label.startswith("summarize") and len(kept) < len(generated.facts):
            notes += _lost_facts_notes(prefix + label, generated, kept, context)
    for method in ("LexRank", "TextRank"):
        started = time.perf_counter()
        text, after, before = _sumy_context(generated, method, auto)
        rows += _retention_rows(
            f"{prefix}sumy {method}, same budget ({auto:,} tokens)",
            generated,
            text,
            after,
            before,
            time.perf_counter() - started,
            target=False,
            kept_percent=None,
            summary=text,
        )
    return rows, notes


def _summary_of(context: dict[str, Any]) -> str:
    summary = context.get("summary") or ""
    if isinstance(summary, dict):
        summary = summary.get("summary") or json.dumps(summary)
    return summary


def _retention_rows(
    label: str,
    generated: Generated,
    text: str,
    after: int,
    before: int,
    seconds: float,
    *,
    target: bool,
    kept_percent: float | None,
    summary: str,
) -> list[Row]:
    kept = [fact for fact in generated.facts if fact in text]
    share = len(kept) / len(generated.facts)
    ratio = after / before
    value = (
        f"{len(kept)}/{len(generated.facts)} = {share:.0%} at {after:,} / {before:,} = "
        f"{ratio:.1%} of the tokens ({seconds:.1f} s)"
    )
    if kept_percent is not None:
        value += f"; loss report keptPercent {kept_percent}"
    if generated.stale:
        stale = [s for s in generated.stale if s in summary]
        value += "; corrected value " + ("still stated" if stale else "replaced")
    return [
        _row(
            f"{label}: facts in the context",
            value,
            f"≥ {TARGET_RETENTION:.0%} at ≤ {TARGET_RATIO:.0%}"
            if target
            else f"≤ {TARGET_RATIO:.0%}",
            (share >= TARGET_RETENTION and ratio <= TARGET_RATIO)
            if target
            else ratio <= TARGET_RATIO,
        )
    ]


# --- sumy baselines ------------------------------------------------------------------------------

_SUMY_CHUNK = 300  # sentences per LexRank/TextRank graph: both are quadratic in sentences


class _Tokenizer:
    """sumy's tokenizer interface without NLTK's punkt data (no download at run time)."""

    language = "english"

    @staticmethod
    def to_sentences(paragraph: str) -> list[str]:
        import re

        return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", paragraph) if s.strip()]

    @staticmethod
    def to_words(sentence: str) -> list[str]:
        import re

        return re.findall(r"\w+", sentence)


def _ratings(summarizer: Any, document: Any) -> dict[Any, float]:
    """Every sentence's score: TextRank exposes them; LexRank computes them inside __call__,
    so its own steps are replayed here."""
    if hasattr(summarizer, "rate_sentences"):
        return dict(summarizer.rate_sentences(document))
    words = [summarizer._to_words_set(s) for s in document.sentences]
    if not words:
        return {}
    tf = summarizer._compute_tf(words)
    idf = summarizer._compute_idf(words)
    matrix = summarizer._create_matrix(words, summarizer.threshold, tf, idf)
    scores = summarizer.power_method(matrix, summarizer.epsilon)
    return dict(zip(document.sentences, scores, strict=True))


def _sumy_context(generated: Generated, method: str, budget: int) -> tuple[str, int, int]:
    """The context a sumy summarizer would leave if it replaced our local one: what summarize
    keeps (system prompt, user messages, the newest two events) plus a `method` summary of
    everything else, filled to `budget` tokens. Returns (text, tokens after, tokens before)."""
    from sumy.parsers.plaintext import PlaintextParser
    from sumy.summarizers.lex_rank import LexRankSummarizer
    from sumy.summarizers.text_rank import TextRankSummarizer

    from sessions_app.tokens import get_counter

    count = get_counter("o200k_base").count
    events = generated.events
    kept_types = ("SYSTEM_PROMPT", "USER_MESSAGE")
    tail = {len(events) - 1, len(events) - 2}
    kept = [e["content"] for i, e in enumerate(events) if e["type"] in kept_types or i in tail]
    folded = [
        e["content"] for i, e in enumerate(events) if not (e["type"] in kept_types or i in tail)
    ]
    tokenizer = _Tokenizer()
    sentences = [s for text in folded for s in tokenizer.to_sentences(text)]
    summarizer = (LexRankSummarizer if method == "LexRank" else TextRankSummarizer)()
    # Rank within chunks, then fill the budget round-robin from each chunk's best sentences.
    ranked_chunks: list[list[str]] = []
    for start in range(0, len(sentences), _SUMY_CHUNK):
        chunk = "\n".join(sentences[start : start + _SUMY_CHUNK])
        document = PlaintextParser.from_string(chunk, tokenizer).document
        rating = _ratings(summarizer, document)
        ranked_chunks.append([str(s) for s, _ in sorted(rating.items(), key=lambda kv: -kv[1])])
    chosen: list[str] = []
    used = 0
    depth = 0
    while used < budget and any(depth < len(c) for c in ranked_chunks):
        for chunk in ranked_chunks:
            if depth < len(chunk):
                cost = count(chunk[depth]) + 1
                if used + cost <= budget:
                    chosen.append(chunk[depth])
                    used += cost
        depth += 1
    text = "\n".join(kept) + "\n" + "\n".join(chosen)
    before = sum(count(e["content"]) + 4 for e in events)
    after = sum(count(t) + 4 for t in kept) + used + 8
    return text, after, before


def _lost_facts_notes(
    label: str, generated: Any, kept: list[str], context: dict[str, Any]
) -> list[str]:
    """Which facts the summarize run lost, who stated them, and what the summary kept of them."""
    lost = [fact for fact in generated.facts if fact not in kept]
    summary = _summary_of(context)
    bullets = [line[2:] for line in summary.splitlines() if line.startswith("- ")]
    openings = Counter(" ".join(b.split()[:5]) for b in bullets)
    opening, repeats = openings.most_common(1)[0] if openings else ("", 0)
    notes = [
        f"{label}: summary {len(summary):,} chars, {len(bullets)} bullets; "
        f"{len(lost)} of {len(generated.facts)} facts lost; most repeated bullet opening: "
        f"“{opening} …” ×{repeats}"
    ]
    for fact in lost:
        index = generated.fact_events.get(fact)
        event = generated.events[index] if index is not None else {}
        # The most specific token of the fact: does any of it survive in the summary?
        marker = max(fact.replace("'", " ").split(), key=len)
        notes.append(
            f"- lost `{fact}` (from {event.get('type', '?')} #{index}; "
            f"`{marker}` {'appears' if marker in summary else 'absent'} in the summary)"
        )
    return notes


# --- parent ------------------------------------------------------------------------------------


def _run_child(turns: int, seed: int, summary_tokens: list[int]) -> tuple[list[Row], list[str]]:
    args = ["--turns", str(turns), "--seed", str(seed)]
    args += ["--summary-tokens", ",".join(map(str, summary_tokens))]
    payload, failure = run_embedded_child(script=__file__, args=args, timeout=1200)
    if failure is not None:
        return [_row("benchmark run", failure, ok=False)], []
    return payload["rows"], payload["notes"]


def _table(rows: list[Row]) -> str:
    lines = ["| figure | value | target | ok |", "|---|---|---|---|"]
    for r in rows:
        ok = "" if r["ok"] is None else ("✅" if r["ok"] else "❌")
        lines.append(f"| {r['figure']} | {r['value']} | {r['target']} | {ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Context Ledger compaction benchmarks.")
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--summary-tokens",
        default=",".join(map(str, DEFAULT_SUMMARY_TOKENS)),
        help="maxSummaryTokens values for the summarize retention figure, comma-separated",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    summary_tokens = [int(n) for n in args.summary_tokens.split(",") if n.strip()]

    if args.child:
        rows, notes = _child(args.turns, args.seed, summary_tokens)
        print(ROW_MARKER + json.dumps({"rows": rows, "notes": notes}), flush=True)
        return 0

    started = time.perf_counter()
    rows, notes = _run_child(args.turns, args.seed, summary_tokens)
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"Context Ledger compaction benchmarks — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}, "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}{load}), "
        f"Python {platform.python_version()}, embedded profile, total "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(_table(rows))
    if notes:
        print()
        print("\n".join(notes))
    return 0 if all(r["ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
