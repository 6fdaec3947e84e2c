"""Generate a realistic, deterministic coding-agent session (~940k tokens) for benchmarks and tests.

The session is a list of event dicts in the REST API's shape (``type``, ``content``, ``name``,
``toolCallId``, ``tokenUsage``): one system prompt, then per turn a user message, one to three
tool calls with large results (source files, test runs, grep hits, JSON payloads) and an agent
message. Distinctive facts (user constraints, decisions, error lines, identifiers, numbers) are
planted in user and agent messages over the first 80 % of the turns, so summarizers can be
checked for what they keep.

No tokenizer is used: sizes are calibrated with per-kind characters-per-token ratios measured
once with tiktoken o200k_base (cl100k_base differs by a few percent on this text).

CLI: ``python bench/session_gen.py --out session.jsonl [--turns 500] [--seed 7]`` writes
OpenAI-style chat JSONL (``role``, ``content``, ``tool_calls``, ``tool_call_id``), one message
a line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GeneratedSession", "generate_session", "to_chat_messages", "write_jsonl"]

# Characters per o200k token, measured on this generator's own output.
_CPT = {
    "prose": 4.47,
    "code": 4.25,
    "tests": 3.51,
    "grep": 3.81,
    "json": 3.25,
    "args": 3.33,
}
# 3 (message framing) + 1 (role) + ~2 (tool name) tokens per message.
_MESSAGE_OVERHEAD = 4
_NAME_TOKENS = 2

_WORDS = [
    "tenant",
    "invoice",
    "ledger",
    "session",
    "token",
    "window",
    "budget",
    "shard",
    "replica",
    "cache",
    "queue",
    "worker",
    "billing",
    "account",
    "report",
    "export",
    "import",
    "schema",
    "migration",
    "index",
    "cursor",
    "page",
    "snapshot",
    "webhook",
    "retry",
    "backoff",
    "quota",
    "limit",
    "policy",
    "audit",
    "event",
    "stream",
    "batch",
    "job",
    "task",
    "run",
]
_VERBS = [
    "load",
    "save",
    "resolve",
    "build",
    "parse",
    "render",
    "sync",
    "flush",
    "merge",
    "split",
    "fetch",
    "apply",
    "validate",
]
_MODULES = [
    "billing",
    "accounts",
    "ledger",
    "sessions",
    "compaction",
    "webhooks",
    "reports",
    "exports",
    "auth",
    "tenants",
    "search",
    "notifications",
    "scheduler",
    "storage",
]
_TOOLS = ("read_file", "bash", "grep", "http_get")


def _camel(rng: random.Random) -> str:
    return "".join(w.capitalize() for w in rng.sample(_WORDS, 2))


def _snake(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(_WORDS)}"


def _path(rng: random.Random, *, test: bool = False) -> str:
    module = rng.choice(_MODULES)
    if test:
        return f"tests/{module}/test_{rng.choice(_WORDS)}.py"
    return f"src/{module}/{rng.choice(_WORDS)}_{rng.choice(['service', 'models', 'views', 'utils'])}.py"


# --- tool output -----------------------------------------------------------------------------


def _code(rng: random.Random, chars: int, path: str) -> str:
    out = [f'"""{path}: {rng.choice(_VERBS)} {rng.choice(_WORDS)} records for the API."""', ""]
    out.append(
        "from __future__ import annotations\n\nimport logging\nfrom dataclasses import dataclass\n"
    )
    size = sum(len(x) + 1 for x in out)
    while size < chars:
        cls, fn, word = _camel(rng), _snake(rng), rng.choice(_WORDS)
        n = rng.randint(2, 999)
        block = (
            f"\n\n@dataclass\nclass {cls}:\n"
            f'    """Holds the {word} state for one {rng.choice(_WORDS)}."""\n\n'
            f"    {word}_id: int\n    limit: int = {n}\n\n"
            f"    def {fn}(self, items: list[dict], *, strict: bool = False) -> list[dict]:\n"
            f"        result = []\n"
            f"        for item in items:\n"
            f"            if strict and item.get('{word}') is None:\n"
            f"                raise ValueError(f'missing {word} in {{item!r}}')\n"
            f"            if len(result) >= self.limit:\n"
            f"                break\n"
            f"            result.append({{**item, '{rng.choice(_WORDS)}': self.{word}_id}})\n"
            f"        logging.getLogger(__name__).debug('{fn}: %d items', len(result))\n"
            f"        return result\n"
        )
        out.append(block)
        size += len(block) + 1
    text = "\n".join(out)
    cut = text.rfind("\n", 0, chars)
    return text[: cut if cut > 0 else chars]


def _test_run(rng: random.Random, chars: int, test_path: str, error: str | None) -> str:
    out = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
        "rootdir: /workspace/app",
        f"collected {rng.randint(40, 400)} items",
        "",
    ]
    size = sum(len(x) + 1 for x in out)
    passed = failed = 0
    while size < chars:
        name = f"test_{_snake(rng)}_{rng.randint(1, 99)}"
        fail = rng.random() < 0.04
        line = f"{test_path}::{name} {'FAILED' if fail else 'PASSED'} [{rng.randint(1, 99):3d}%]"
        out.append(line)
        size += len(line) + 1
        if fail:
            failed += 1
            exc = error or f"AssertionError: assert {rng.randint(1, 500)} == {rng.randint(1, 500)}"
            trace = (
                f"\n____________________ {name} ____________________\n\n"
                f"    def {name}(client):\n        response = client.get('/api/v1/{rng.choice(_WORDS)}s')\n"
                f">       assert response.status_code == 200\nE       {exc}\n\n"
                f"{test_path}:{rng.randint(10, 400)}: {exc.split(':')[0]}"
            )
            out.append(trace)
            size += len(trace) + 1
        else:
            passed += 1
    out.append(f"========= {failed} failed, {passed} passed in {rng.uniform(1, 40):.2f}s =========")
    return "\n".join(out)


def _grep(rng: random.Random, chars: int, pattern: str) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        line = (
            f"{_path(rng)}:{rng.randint(1, 900)}:        "
            f"{rng.choice(['return', 'value =', 'if', 'await'])} {pattern}(self.{rng.choice(_WORDS)}, "
            f"{rng.choice(_WORDS)}_id={rng.randint(1, 9999)})"
        )
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def _json(rng: random.Random, chars: int) -> str:
    records: list[dict[str, Any]] = []
    size = 40
    while size < chars:
        record = {
            "id": f"{rng.choice(_WORDS)}_{rng.randint(1000, 99999)}",
            "status": rng.choice(["active", "suspended", "pending", "closed"]),
            "owner": {"name": _camel(rng), "email": f"{rng.choice(_WORDS)}@example.com"},
            "balance": round(rng.uniform(0, 50_000), 2),
            "tags": rng.sample(_WORDS, 3),
            "updated_at": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T10:{rng.randint(0, 59):02d}:00Z",
        }
        records.append(record)
        size += 260
    return json.dumps({"count": len(records), "results": records}, indent=2)


# --- facts -----------------------------------------------------------------------------------


def _make_facts(rng: random.Random, count: int) -> list[tuple[str, str, str]]:
    """(fact, role that states it, sentence embedding it)."""
    facts: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    kinds = ["constraint", "decision", "error", "identifier", "number"]
    i = 0
    while len(facts) < count:
        kind = kinds[i % len(kinds)]
        i += 1
        n = rng.randint(10, 9999)
        if kind == "constraint":
            fact = rng.choice(
                [
                    f"never use port {rng.randint(1025, 65000)}",
                    f"always pin {rng.choice(_WORDS)}lib to version {rng.randint(1, 9)}.{n}",
                    f"do not modify the {rng.choice(_MODULES)}_legacy_{n} module",
                ]
            )
            text = (
                f"Important constraint: {fact}. Please keep that in mind for the rest of the work."
            )
            role = "user"
        elif kind == "decision":
            fact = rng.choice(
                [
                    f"decided to use PostgreSQL advisory locks for {rng.choice(_WORDS)}_{n}",
                    f"we will use {_camel(rng)}Queue{n} instead of polling",
                ]
            )
            text = f"After comparing the options I {fact.replace('decided', 'have decided') if fact.startswith('decided') else 'confirm ' + fact}."
            role = "assistant"
        elif kind == "error":
            fact = rng.choice(
                [f"KeyError: 'tenant_id_{n}'", f"ValueError: invalid shard count {n}"]
            )
            text = f"The job crashed again with {fact} when the worker restarted."
            role = rng.choice(["user", "assistant"])
        elif kind == "identifier":
            fact = f"{_camel(rng)}Resolver{n}"
            text = f"The lookup goes through {fact} in the {rng.choice(_MODULES)} package, so I changed it there."
            role = "assistant"
        else:
            fact = f"{n * 7 + 3} requests per minute"
            text = f"Note that the upstream rate limit is {fact}; stay below it in the load test."
            role = "user"
        if fact in seen:
            continue
        seen.add(fact)
        facts.append((fact, role, text))
    return facts


# --- session ---------------------------------------------------------------------------------


@dataclass
class GeneratedSession:
    """A generated session: API-shaped events, the planted facts, and the approximate size."""

    events: list[dict[str, Any]]
    facts: list[str]
    approx_tokens: int
    # fact -> index in `events` of the message that states it
    fact_events: dict[str, int] = field(default_factory=dict)


_SYSTEM_PROMPT = (
    "You are a careful senior software engineer working in a Python monorepo through tools "
    "(read_file, bash, grep, http_get). Make minimal, well-tested changes, explain decisions "
    "briefly, and never invent file contents you have not read."
)

_REQUESTS = (
    "Can you look at why {test} is failing and fix it?",
    "Please add pagination to the {word} export endpoint in {path}.",
    "Refactor {ident} in {path} so it no longer hits the database in a loop.",
    "The {word} report is slow for large tenants; profile {path} and speed it up.",
    "Add a retry with backoff around the {word} webhook sender.",
    "Write tests for {ident} covering the empty and the {word} cases.",
    "Check the staging API response for {word}s and compare it with what {path} expects.",
)
_AGENT = (
    "I read {path} and the failing test. The problem is that {ident} assumes the {word} list "
    "is sorted. I changed it to sort by id first and re-ran the tests: they pass now.",
    "Done: {ident} now batches the {word} queries (one query per page instead of one per row). "
    "The test suite is green.",
    "I found {count} call sites of {ident} with grep. I updated the two in {path}; the others "
    "already pass the {word} explicitly.",
    "The API returns {count} {word}s with the expected fields. {path} reads `results` and "
    "`count`, so no change is needed there.",
)


def _tool_call(rng: random.Random, tool: str, turn: int, k: int) -> tuple[str, dict[str, Any], str]:
    """(tool call id, arguments, result kind)."""
    call_id = f"call_{turn:04d}_{k}_{rng.getrandbits(32):08x}"
    if tool == "read_file":
        return call_id, {"path": _path(rng)}, "code"
    if tool == "bash":
        return call_id, {"command": f"pytest -q {_path(rng, test=True)}"}, "tests"
    if tool == "grep":
        return call_id, {"pattern": _snake(rng), "path": "src/"}, "grep"
    return (
        call_id,
        {"url": f"https://staging.example.com/api/v1/{rng.choice(_WORDS)}s?page=1"},
        "json",
    )


def _est(text: str, kind: str) -> int:
    return int(len(text) / _CPT[kind]) + _MESSAGE_OVERHEAD


def generate_session(
    *, turns: int = 500, seed: int = 7, target_tokens: int = 940_000
) -> GeneratedSession:
    """Build a deterministic session of about `target_tokens` tokens (±5 % with o200k/cl100k)."""
    if turns < 1:
        raise ValueError("turns must be >= 1")
    rng = random.Random(seed)
    events: list[dict[str, Any]] = [{"type": "SYSTEM_PROMPT", "content": _SYSTEM_PROMPT}]
    total = _est(_SYSTEM_PROMPT, "prose")
    n_facts = max(1, min(40, turns // 4))
    planted = _make_facts(rng, n_facts)
    fact_turns = sorted(
        rng.sample(range(max(1, int(turns * 0.8))), min(n_facts, max(1, int(turns * 0.8))))
    )
    facts_at: dict[int, list[tuple[str, str, str]]] = {}
    for index, turn in enumerate(fact_turns):
        facts_at.setdefault(turn, []).append(planted[index])
    for index in range(len(fact_turns), n_facts):  # fewer slots than facts on tiny sessions
        facts_at.setdefault(fact_turns[-1], []).append(planted[index])
    fact_events: dict[str, int] = {}

    for turn in range(turns):
        # Spread what is left evenly over the remaining turns so the total lands on target.
        per_turn = max(200, (target_tokens - total) // (turns - turn))
        # Real turns vary a lot (a one-line grep vs. a 10k-token file); the even spreading
        # above pulls the total back on target over the following turns.
        if turns - turn > 10:
            per_turn = int(per_turn * min(4.0, rng.lognormvariate(-0.15, 0.55)))
        turn_facts = facts_at.get(turn, [])
        fill = {
            "path": _path(rng),
            "test": f"{_path(rng, test=True)}::test_{_snake(rng)}",
            "ident": rng.choice([_camel(rng), _snake(rng)]),
            "word": rng.choice(_WORDS),
            "count": rng.randint(2, 40),
        }
        user = rng.choice(_REQUESTS).format(**fill)
        for fact, role, text in turn_facts:
            if role == "user":
                user += " " + text
        events.append({"type": "USER_MESSAGE", "content": user})
        for fact, role, _ in turn_facts:
            if role == "user":
                fact_events[fact] = len(events) - 1
        used = _est(user, "prose")
        context_before = total + used

        agent = rng.choice(_AGENT).format(**fill)
        for _, role, text in turn_facts:
            if role == "assistant":
                agent += " " + text
        agent_cost = _est(agent, "prose")

        calls = [_tool_call(rng, rng.choice(_TOOLS), turn, k) for k in range(rng.randint(1, 3))]
        call_costs = [_est(json.dumps(args), "args") + _NAME_TOKENS for _, args, _ in calls]
        budget = max(50, per_turn - used - agent_cost - sum(call_costs))
        weights = [rng.uniform(0.5, 1.5) for _ in calls]
        completion = sum(call_costs)
        error_line = next(
            (f for f, _, _ in turn_facts if f.startswith(("KeyError", "ValueError"))), None
        )
        for (call_id, args, kind), cost, weight in zip(calls, call_costs, weights, strict=True):
            name = {"code": "read_file", "tests": "bash", "grep": "grep", "json": "http_get"}[kind]
            tokens = int(budget * weight / sum(weights))
            chars = max(40, int((tokens - _MESSAGE_OVERHEAD - _NAME_TOKENS) * _CPT[kind]))
            if kind == "code":
                result = _code(rng, chars, args["path"])
            elif kind == "tests":
                result = _test_run(rng, chars, args["command"].split()[-1], error_line)
            elif kind == "grep":
                result = _grep(rng, chars, args["pattern"])
            else:
                result = _json(rng, chars)
            events.append(
                {
                    "type": "TOOL_CALL",
                    "content": json.dumps(args),
                    "name": name,
                    "toolCallId": call_id,
                }
            )
            events.append(
                {"type": "TOOL_RESULT", "content": result, "name": name, "toolCallId": call_id}
            )
            used += cost + _est(result, kind) + _NAME_TOKENS
        events.append(
            {
                "type": "AGENT_MESSAGE",
                "content": agent,
                "tokenUsage": {
                    "promptTokens": context_before,
                    "completionTokens": completion + agent_cost,
                    "totalTokens": context_before + completion + agent_cost,
                },
            }
        )
        for fact, role, _ in turn_facts:
            if role == "assistant":
                fact_events[fact] = len(events) - 1
        total += used + agent_cost
    return GeneratedSession(
        events=events,
        facts=[fact for fact, _, _ in planted],
        approx_tokens=total + 3,
        fact_events=fact_events,
    )


# --- export ----------------------------------------------------------------------------------


def to_chat_messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style chat messages: each TOOL_CALL becomes an assistant message with one call."""
    roles = {"SYSTEM_PROMPT": "system", "USER_MESSAGE": "user", "AGENT_MESSAGE": "assistant"}
    messages: list[dict[str, Any]] = []
    for event in events:
        kind = event["type"]
        if kind == "TOOL_CALL":
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": event["toolCallId"],
                            "type": "function",
                            "function": {"name": event["name"], "arguments": event["content"]},
                        }
                    ],
                }
            )
        elif kind == "TOOL_RESULT":
            messages.append(
                {"role": "tool", "tool_call_id": event["toolCallId"], "content": event["content"]}
            )
        else:
            messages.append({"role": roles[kind], "content": event["content"]})
    return messages


def write_jsonl(path: Path, events: list[dict[str, Any]]) -> int:
    """Write `events` as chat JSONL; returns the number of lines written."""
    messages = to_chat_messages(events)
    with path.open("w", encoding="utf-8") as fh:
        for message in messages:
            fh.write(json.dumps(message, ensure_ascii=False) + "\n")
    return len(messages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--target-tokens", type=int, default=940_000)
    args = parser.parse_args(argv)
    session = generate_session(turns=args.turns, seed=args.seed, target_tokens=args.target_tokens)
    lines = write_jsonl(args.out, session.events)
    print(
        f"wrote {lines} messages (~{session.approx_tokens} tokens, {len(session.facts)} facts) "
        f"to {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
