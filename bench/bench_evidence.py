"""Evidence benchmarks (issue 24): which facts of real tools' output survive a `summarize`
compaction, per tool family, and whether summarize stays linear in the session's size.

    .venv/bin/python bench/bench_evidence.py [--repeats 3]

Runs in a child process on the embedded profile against a throwaway SQLite file (as
`bench_compaction.py` does), through the REST API with a real Celery worker thread.

1. Facts kept per tool family: the hand-written corpus `tests/fixtures/tool_outputs/` (each
   output with the facts written beside it), four outputs buried apart in a session of 200
   routine tool results (`bench/tool_output_session.py`), compacted with `summarize` +
   `local` (keepRecentEvents 2) at the auto summary budget of a 200k window (4,000 tokens) and
   at maxSummaryTokens 2,000; a fact is kept when it is in the text of `GET /context`.
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


def _child(repeats: int) -> dict[str, Any]:
    user, token = django_child()
    from bench_compaction import _client, _compact, _context_text, _ingest
    from celery.contrib.testing.worker import start_worker

    from compaction_app.testkit.session_gen import generate_session
    from compaction_app.testkit.tool_output_session import buried_session, facts_kept, load_corpus
    from config.celery import app

    client = _client(token)
    corpus = load_corpus()
    families: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    lost: dict[str, list[str]] = defaultdict(list)
    timing: dict[str, list[float]] = {}
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
                for fixture in group:
                    kept = facts_kept(text, fixture.facts)
                    families[fixture.family][label][0] += len(kept)
                    families[fixture.family][label][1] += len(fixture.facts)
                    lost[label] += [
                        f"{fixture.name}: `{f}`" for f in fixture.facts if f not in kept
                    ]
        for name, turns, target in (("1x", 125, 235_000), ("4x", 500, 940_000)):
            session = generate_session(turns=turns, seed=7, target_tokens=target)
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
    return {
        "families": {f: dict(v) for f, v in families.items()},
        "lost": dict(lost),
        "timing": timing,
    }


def _run_child(repeats: int) -> dict[str, Any]:
    payload, failure = run_embedded_child(
        script=__file__, args=["--repeats", str(repeats)], timeout=3600
    )
    if failure is not None:
        raise SystemExit(f"benchmark child {failure}")
    return payload


def _report(result: dict[str, Any]) -> tuple[str, bool]:
    families = result["families"]
    labels = ["auto" if b is None else str(b) for b in BUDGETS]
    lines = [
        "| tool family | outputs | facts kept, auto budget (4,000) | facts kept, maxSummaryTokens 2,000 |",
        "|---|---:|---:|---:|",
    ]
    totals = {label: [0, 0] for label in labels}
    from compaction_app.testkit.tool_output_session import load_corpus

    outputs: dict[str, int] = defaultdict(int)
    for fixture in load_corpus():
        outputs[fixture.family] += 1
    for family in sorted(families):
        cells = []
        for label in labels:
            kept, total = families[family].get(label, [0, 0])
            totals[label][0] += kept
            totals[label][1] += total
            cells.append(f"{kept}/{total}")
        lines.append(f"| {family} | {outputs[family]} | {' | '.join(cells)} |")
    ok = True
    cells = []
    for budget, label in zip(BUDGETS, labels, strict=True):
        kept, total = totals[label]
        share = kept / total if total else 0.0
        good = share >= TARGETS[budget]
        ok = ok and good
        cells.append(
            f"**{kept}/{total} = {share:.1%}** (≥ {TARGETS[budget]:.0%} {'✅' if good else '❌'})"
        )
    lines.append(f"| **all** | {sum(outputs.values())} | {' | '.join(cells)} |")
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
    for label in labels:
        if result["lost"].get(label):
            lines.append("")
            lines.append(f"Lost at {label}: " + "; ".join(result["lost"][label]))
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Context Ledger evidence benchmarks.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(ROW_MARKER + json.dumps(_child(args.repeats)), flush=True)
        return 0
    started = time.perf_counter()
    result = _run_child(args.repeats)
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
