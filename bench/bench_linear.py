"""Linearity: does the work grow with the session, or faster?

    .venv/bin/python bench/bench_linear.py [--repeats 3]

Runs in a child process on the embedded profile against a throwaway SQLite file, with a real
Celery worker thread, on `compaction_app/testkit/session_gen.py`'s session at 1× (≈ 235k
tokens) and 4× (≈ 940k tokens) the history, in a 1,000,000-token window:

1. `summarize` + `local` with default settings (auto budget), from `POST /compactions` to
   `COMPACTION_COMPLETE` on the websocket, best of `--repeats`; the figure is the 4× time per
   token over the 1× time per token (target ≤ 1.2).
2. `GET /context?maxTokens=200000` on the same sessions before compaction (a pruned view of the
   newest 200k tokens whatever the session's size): time per returned byte at 4× over 1×
   (target ≤ 1.5: flat, the answer is the same size).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

from harness import django_child, emit, run_embedded_child

LIMIT = 1_000_000
SUMMARIZE_TARGET = 1.2
CONTEXT_TARGET = 1.5
SIZES = (("1x", 125, 235_000), ("4x", 500, 940_000))


def _child(repeats: int) -> dict[str, Any]:
    user, token = django_child()
    from bench_compaction import _client, _compact, _ingest
    from celery.contrib.testing.worker import start_worker

    from compaction_app.testkit.session_gen import generate_session
    from config.celery import app

    client = _client(token)
    result: dict[str, Any] = {}
    with start_worker(app, perform_ping_check=False, pool="solo", loglevel="WARNING"):
        for name, turns, target_tokens in SIZES:
            generated = generate_session(turns=turns, seed=7, target_tokens=target_tokens)
            body = json.dumps(generated.events)
            # The generator's events are this process's, not a server's: dropped, so a timed
            # request's garbage collections do not walk a heap a server would not have.
            del generated
            summarize: list[tuple[float, int]] = []
            context: list[tuple[float, int]] = []
            for k in range(repeats):
                session_id = _ingest(
                    client, body, f"linear-{name}-{k}", {"autoCompact": False}, context_limit=LIMIT
                )
                gc.collect()
                started = time.perf_counter()
                response = client.get(f"/api/v1/sessions/{session_id}/context?maxTokens=200000")
                context.append((time.perf_counter() - started, len(response.content)))
                assert response.status_code == 200, response.content[:300]
                _, complete, seconds = _compact(
                    token, session_id, {"strategy": "summarize", "summarizer": "local"}
                )
                assert complete["success"], complete
                summarize.append((seconds, complete["tokensBefore"]))
            result[name] = {"summarize": min(summarize), "context": min(context)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        emit(_child(args.repeats))  # type: ignore[arg-type]
        return 0
    result, failed = run_embedded_child(
        script=__file__, args=["--repeats", str(args.repeats)], timeout=3600
    )
    if result is None:
        print(f"bench_linear: the child {failed}", file=sys.stderr)
        return 2
    one, four = result["1x"], result["4x"]
    per_token = [r["summarize"][0] / r["summarize"][1] for r in (one, four)]
    per_byte = [r["context"][0] / r["context"][1] for r in (one, four)]
    s_ratio, c_ratio = per_token[1] / per_token[0], per_byte[1] / per_byte[0]
    print("| figure | 1× | 4× | 4× / 1× | target |")
    print("|---|---|---|---|---|")
    print(
        f"| summarize (s; tokens before) | {one['summarize'][0]:.2f} ({one['summarize'][1]:,}) "
        f"| {four['summarize'][0]:.2f} ({four['summarize'][1]:,}) | **{s_ratio:.2f}×** per token "
        f"| ≤ {SUMMARIZE_TARGET} {'✅' if s_ratio <= SUMMARIZE_TARGET else '❌'} |"
    )
    print(
        f"| GET /context?maxTokens=200000 (ms; bytes) | {1000 * one['context'][0]:.0f} "
        f"({one['context'][1]:,}) | {1000 * four['context'][0]:.0f} ({four['context'][1]:,}) "
        f"| **{c_ratio:.2f}×** per byte | ≤ {CONTEXT_TARGET} "
        f"{'✅' if c_ratio <= CONTEXT_TARGET else '❌'} |"
    )
    return 0 if s_ratio <= SUMMARIZE_TARGET and c_ratio <= CONTEXT_TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
