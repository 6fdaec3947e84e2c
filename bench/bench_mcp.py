"""MCP benchmark (issue 23): tool-call latency of `ledger_usage` and `ledger_search` on a
3,000-event session, through the official `mcp` client over Streamable HTTP. Prints one
markdown table.

    .venv/bin/python bench/bench_mcp.py [--profile embedded|postgres|both] [--rounds 20]

The session is `session_gen.py`'s coding-agent session cut to 3,000 events, appended in one
`POST /events` and indexed for search before timing. The server is the real one (daphne
serving config.asgi in a thread of the child); the client is `mcp.Client` (the SDK's default
negotiation: protocol 2026-07-28, one POST per call; the handshake era answers the same), one
client for all calls, so a figure is one tool call: HTTP request, token auth, the tool's
queries on a database thread, JSON response.

- search: `ledger_search` for the planted facts' keys and a few everyday queries (the search
  benchmark's), `--rounds` rounds after a warm-up round; p50 / p95.
- usage: `ledger_usage` of the session by id, once before each search call (the same load);
  p50 / p95.

Each profile runs in a child process against a throwaway database (see harness.py).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from harness import Row, api_session, django_child, profile_main
from harness import row as _row

ROOT = Path(__file__).resolve().parent.parent
PG_DB = "bench_mcp"
EVENTS = 3000
TURNS = 500  # session_gen turns that give just over 3,000 events
SEARCH_LIMIT = 10
USAGE_P50_TARGET_MS = 25.0
SEARCH_P50_TARGET_MS = 50.0
EVERYDAY_QUERIES = ["tenant", "invo", "src/billing", "retry backoff", "AssertionError", "limit"]


def _percentiles(timings: list[float]) -> tuple[float, float]:
    timings = sorted(timings)
    return statistics.median(timings), timings[max(0, int(len(timings) * 0.95) - 1)]


def _child(profile: str, rounds: int) -> list[Row]:
    user, token = django_child(profile=profile, pg_db=PG_DB)
    from bench_search import fact_key
    from django.test import Client

    from compaction_app.testkit.session_gen import generate_session
    from sessions_app.models import Session
    from sessions_app.search import search_session

    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    generated = generate_session(turns=TURNS, target_tokens=int(940_000 * TURNS / 500))
    events = generated.events[:EVENTS]
    session_id = api_session(client, title="mcp bench")
    response = client.post(
        f"/api/v1/sessions/{session_id}/events",
        json.dumps(events),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content[:300]
    session = Session.objects.get(pk=session_id)
    # Index now (the Celery task's work; no worker here) so no timed call pays for it.
    search_session(session=session, text="tenant", limit=1)
    keys = [
        fact_key(fact) for fact, index in generated.fact_events.items() if index < EVENTS
    ] + EVERYDAY_QUERIES
    from compaction_app.testkit.daphne_thread import serve_in_thread

    _, base_url = serve_in_thread()

    import anyio
    from mcp import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def measure() -> dict[str, Any]:
        headers = {"Authorization": f"Token {token}"}
        async with create_mcp_http_client(headers=headers) as http:
            transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
            async with McpClient(transport) as mcp:

                async def timed(tool: str, arguments: dict[str, Any]) -> float:
                    started = time.perf_counter()
                    result = await mcp.call_tool(tool, arguments)
                    elapsed = (time.perf_counter() - started) * 1000
                    assert not result.is_error, result.content[0]
                    return elapsed

                usage_args = {"session": session_id}
                for q in keys:  # warm-up
                    await timed("ledger_usage", usage_args)
                    await timed("ledger_search", {"session": session_id, "query": q})
                # Interleaved, so both see the same load on a shared machine.
                usage, search = [], []
                for _ in range(rounds):
                    for q in keys:
                        usage.append(await timed("ledger_usage", usage_args))
                        search.append(
                            await timed(
                                "ledger_search",
                                {"session": session_id, "query": q, "limit": SEARCH_LIMIT},
                            )
                        )
                return {"usage": usage, "search": search}

    timings = anyio.run(measure)
    usage_p50, usage_p95 = _percentiles(timings["usage"])
    search_p50, search_p95 = _percentiles(timings["search"])
    return [
        _row(
            profile,
            f"ledger_usage on a {len(events):,}-event session, {len(timings['usage'])} calls: "
            "p50 / p95",
            f"{usage_p50:.1f} ms / {usage_p95:.1f} ms",
            f"p50 ≤ {USAGE_P50_TARGET_MS:.0f} ms",
            usage_p50 <= USAGE_P50_TARGET_MS,
        ),
        _row(
            profile,
            f"ledger_search on a {len(events):,}-event session, {len(keys)} queries × {rounds} "
            f"(limit {SEARCH_LIMIT}): p50 / p95",
            f"{search_p50:.1f} ms / {search_p95:.1f} ms",
            f"p50 ≤ {SEARCH_P50_TARGET_MS:.0f} ms",
            search_p50 <= SEARCH_P50_TARGET_MS,
        ),
    ]


# --- parent ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    return profile_main(
        argv,
        title="Context Ledger MCP benchmark",
        description="Context Ledger MCP benchmark (issue 23).",
        script=__file__,
        pg_db=PG_DB,
        child=_child,
        option="--rounds",
        default=5,
        help="timed rounds over all queries",
        timeout=900,
    )


if __name__ == "__main__":
    raise SystemExit(main())
