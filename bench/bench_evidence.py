"""Evidence benchmarks (issue 24): which facts of real tools' output survive a `summarize`
compaction, per tool family, on the REST path and through the gateway, and whether summarize
stays linear in the session's size.

    .venv/bin/python bench/bench_evidence.py [--repeats 3] [--outputs N]

(`--outputs N`: only the corpus's first N outputs, for a quick look; the figures need all.)

Runs in a child process on the embedded profile against a throwaway SQLite file (as
`bench_compaction.py` does), with a real Celery worker thread, daphne serving the app in a
thread and the provider stand-in (compaction_app/testkit/provider_standin.py) as the gateway's
OpenAI upstream.

1. Facts kept per tool family: the hand-written corpus `tests/fixtures/tool_outputs/` (each
   output with the facts written beside it), four outputs buried apart in a session of 200
   routine tool results (`compaction_app/testkit/tool_output_session.py`), at two summary
   budgets: 4,000 tokens (the auto budget of a 200k window) and 2,000. A fact is kept when it
   is in the text of what the model would see next.
   - REST: the events appended over the API, `POST /compactions` (`summarize` + `local`,
     keepRecentEvents 2, maxSummaryTokens auto in a 200k window, then 2,000), then the text
     of `GET /context`.
   - Gateway: the same session sent by the official `openai` SDK to the gateway
     (`/gateway/openai/v1`, Chat Completions), then the window set so that the session plus
     its closing question lands between `compactThreshold` and the hard limit, and the
     question sent: the gateway compacts in the call path (`summarize` + `local`,
     maxSummaryTokens 4,000 or 2,000) and the facts are counted in the messages it forwards
     to the stand-in. `fitTargetRatio` is 0.1: with the default 0.5, clearing the old tool
     results alone reaches the mark, so the gateway clears them instead of summarizing (no
     summary: each placeholder keeps its output's most salient lines, the rest stays in the
     ledger for search and recall); that default run is measured too, in its own column.
2. Linearity: `summarize` + `local` with default settings on `session_gen.py`'s session at 1×
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
TARGETS = {None: 0.95, 2000: 0.85}
LINEAR_TARGET = 1.2
MODEL = "gpt-4.1"
# The gateway's window puts the session, once its closing question is added, between
# compactThreshold (0.8) and the hard limit (0.95).
GATEWAY_FILL = 0.88
# Below what clearing the old tool results leaves (~7k of a ~59k window): the gateway
# summarizes. None: the session's default (0.5), where it clears them instead.
GATEWAY_TARGET = 0.1
# The gateway's window is a quarter of the REST one, so its auto budget would be smaller:
# the REST path's auto budget is given explicitly.
GATEWAY_BUDGETS = {None: 4000, 2000: 2000}


def _child(repeats: int, outputs: int) -> dict[str, Any]:
    user, token = django_child()
    from bench_compaction import _client, _compact, _context_text, _ingest
    from celery.contrib.testing.worker import start_worker
    from django.conf import settings

    from compaction_app.testkit.daphne_thread import serve_in_thread
    from compaction_app.testkit.provider_standin import ProviderStandIn
    from compaction_app.testkit.session_gen import generate_session
    from compaction_app.testkit.tool_output_session import buried_session, facts_kept, load_corpus
    from config.celery import app

    client = _client(token)
    corpus = load_corpus()[:outputs]
    families: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    lost: dict[str, list[str]] = defaultdict(list)
    timing: dict[str, list[float]] = {}

    def count(label: str, group: list[Any], text: str) -> None:
        for fixture in group:
            kept = facts_kept(text, fixture.facts)
            families[fixture.family][label][0] += len(kept)
            families[fixture.family][label][1] += len(fixture.facts)
            lost[label] += [f"{fixture.name}: `{f}`" for f in fixture.facts if f not in kept]

    standin = ProviderStandIn().start()
    settings.LEDGER_OPENAI_UPSTREAM = standin.openai_url
    try:
        with start_worker(app, perform_ping_check=False, pool="solo", loglevel="WARNING"):
            for budget in BUDGETS:
                label = "auto" if budget is None else str(budget)
                for start in range(0, len(corpus), GROUP):
                    group = corpus[start : start + GROUP]
                    events = buried_session(group, routine=200)
                    session_id = _ingest(
                        client,
                        json.dumps(events),
                        f"evidence-{label}-{start}",
                        {"keepRecentEvents": 2, "maxSummaryTokens": budget},
                        context_limit=LIMIT,
                    )
                    _, complete, _seconds = _compact(
                        token, session_id, {"strategy": "summarize", "summarizer": "local"}
                    )
                    assert complete["success"], complete
                    text, _context = _context_text(client, session_id)
                    count(label, group, text)
            for name, turns, target_tokens in (("1x", 125, 235_000), ("4x", 500, 940_000)):
                session = generate_session(turns=turns, seed=7, target_tokens=target_tokens)
                body = json.dumps(session.events)
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
            gateway_runs: list[tuple[str, int | None, float | None]] = [
                (f"gateway {GATEWAY_BUDGETS[b]}", GATEWAY_BUDGETS[b], GATEWAY_TARGET)
                for b in BUDGETS
            ]
            gateway_runs.append(("gateway default", None, None))
            for label, budget, target in gateway_runs:
                for start in range(0, len(corpus), GROUP):
                    group = corpus[start : start + GROUP]
                    text = _through_gateway(
                        token,
                        base_url,
                        standin,
                        buried_session(group, routine=200),
                        name=f"{label}-{start}",
                        budget=budget,
                        target=target,
                    )
                    count(label, group, text)
                    standin.requests.clear()
    finally:
        standin.close()
    return {
        "families": {f: dict(v) for f, v in families.items()},
        "lost": dict(lost),
        "timing": timing,
    }


def _through_gateway(
    token: str,
    base_url: str,
    standin: Any,
    events: list[dict[str, Any]],
    *,
    name: str,
    budget: int | None,
    target: float | None,
) -> str:
    """Send `events` to the gateway as an agent would, make its closing question cross the
    compaction threshold, and return the text of what the gateway forwarded upstream."""
    import openai
    from bench_compaction import _client

    from compaction_app.gateway import after
    from compaction_app.models import CompactionRun, Trigger
    from compaction_app.testkit.tool_output_session import chat_messages
    from sessions_app.models import Session
    from sessions_app.threads import main_thread

    gateway = openai.OpenAI(
        api_key="sk-bench-not-a-key",
        base_url=f"{base_url}/gateway/openai/v1",
        default_headers={"X-Ledger-Key": token, "X-Ledger-Session": name},
        max_retries=0,
        timeout=300,
    )
    # The day's work, recorded as the gateway records any call; the closing question
    # (`What is the state now?`) comes once the window is set.
    history = chat_messages(events[:-2])
    reply = gateway.chat.completions.create(model=MODEL, messages=history)
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
    history += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": events[-2]["content"]},
    ]
    raw = gateway.chat.completions.with_raw_response.create(model=MODEL, messages=history)
    assert raw.headers["X-Ledger-Compacted"] == "true", dict(raw.headers)
    after.wait_idle(timeout=60)
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)
    expected = "summarize" if target is not None else "clear_tool_results"
    assert (run.status, run.strategy) == ("completed", expected), (run.status, run.strategy)
    forwarded = standin.requests[-1].body["messages"]
    return "\n".join(m["content"] for m in forwarded if isinstance(m.get("content"), str))


def _run_child(repeats: int, outputs: int) -> dict[str, Any]:
    payload, failure = run_embedded_child(
        script=__file__, args=["--repeats", str(repeats), "--outputs", str(outputs)], timeout=3600
    )
    if failure is not None:
        raise SystemExit(f"benchmark child {failure}")
    return payload


# (label, heading, target): the budgets of both paths (the gateway's default fit has no target).
COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("auto", "REST, auto (4,000)", TARGETS[None]),
    ("2000", "REST, 2,000", TARGETS[2000]),
    ("gateway 4000", "gateway, 4,000", TARGETS[None]),
    ("gateway 2000", "gateway, 2,000", TARGETS[2000]),
)
DEFAULT_FIT = "gateway default"


def _report(result: dict[str, Any]) -> tuple[str, bool]:
    families = result["families"]
    lines = [
        "| tool family | outputs | "
        + " | ".join(h for _, h, _ in COLUMNS)
        + " | gateway, default fit (clears) |",
        "|---|---:|" + "---:|" * (len(COLUMNS) + 1),
    ]
    totals = {label: [0, 0] for label, _, _ in COLUMNS}
    totals[DEFAULT_FIT] = [0, 0]
    from compaction_app.testkit.tool_output_session import load_corpus

    outputs: dict[str, int] = defaultdict(int)
    for fixture in load_corpus():
        outputs[fixture.family] += 1
    for family in sorted(families):
        cells = []
        for label in totals:
            kept, total = families[family].get(label, [0, 0])
            totals[label][0] += kept
            totals[label][1] += total
            cells.append(f"{kept}/{total}")
        lines.append(f"| {family} | {outputs[family]} | {' | '.join(cells)} |")
    ok = True
    cells = []
    for label, _, target in COLUMNS:
        kept, total = totals[label]
        share = kept / total if total else 0.0
        good = share >= target
        ok = ok and good
        cells.append(f"**{kept}/{total} = {share:.1%}** (≥ {target:.0%} {'✅' if good else '❌'})")
    kept, total = totals[DEFAULT_FIT]
    cells.append(f"**{kept}/{total} = {kept / total if total else 0:.1%}**")
    lines.append(f"| **all** | {sum(outputs.values())} | {' | '.join(cells)} |")
    lines += [
        "",
        f"Gateway with the default fitTargetRatio (0.5): it clears the old tool results instead "
        f"of summarizing, each placeholder keeping its output's most salient lines; facts in "
        f"what it forwards: {kept}/{total} = {kept / total if total else 0:.1%} (the rest stay "
        f"in the ledger: search, recall).",
    ]
    timing = result["timing"]
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
    for label, heading, _ in COLUMNS:
        if result["lost"].get(label):
            lines.append("")
            lines.append(f"Lost ({heading}): " + "; ".join(result["lost"][label]))
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Context Ledger evidence benchmarks.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--outputs", type=int, default=1_000, help="corpus outputs to bury")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(ROW_MARKER + json.dumps(_child(args.repeats, args.outputs)), flush=True)
        return 0
    started = time.perf_counter()
    result = _run_child(args.repeats, args.outputs)
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"Context Ledger evidence benchmarks — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}, "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}{load}), "
        f"Python {platform.python_version()}, embedded profile, total "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    table, ok = _report(result)
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
