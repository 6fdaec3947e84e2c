"""Generate a realistic agent transcript for the retention bench: shell sessions with exit
codes, JSON API replies, diffs, tracebacks, SQL, config, git and kubectl output, written the way
the tools print them, and one late correction.

Unlike `session_gen.py`, most planted facts live in **tool output** (the failing command's error
code, the constraint a psql error names, the commit `git bisect` blames, the setting a diff
changes), surrounded by output of the same tools that succeeded. Each fact is judged by a short
key (an identifier or number), so a summary that paraphrases still counts.

    python bench/realistic_gen.py --out real.jsonl [--turns 160] [--seed 11]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compaction_app.testkit.session_gen import _code, _json, write_jsonl

__all__ = ["RealisticSession", "generate_realistic_session"]

_CPT = 3.6  # characters per o200k token on this generator's output, measured once
_WORDS = ("orders", "refunds", "invoices", "tenants", "payouts", "ledger", "carts", "users")
_SERVICES = ("api", "billing", "worker", "gateway", "scheduler", "search")
_PACKAGES = ("psycopg", "celery", "redis", "httpx", "pydantic", "sqlalchemy", "uvicorn")


@dataclass
class RealisticSession:
    events: list[dict[str, Any]]
    facts: list[str]
    approx_tokens: int
    fact_events: dict[str, int] = field(default_factory=dict)
    # A value the late correction replaced: a good summary no longer states it.
    stale: list[str] = field(default_factory=list)


def _hex(rng: random.Random, n: int = 7) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


# --- tool output: one planted fact each -----------------------------------------------------


def _json_error(rng: random.Random, k: int) -> tuple[str, str, str]:
    code = f"ERR_{rng.choice(('QUOTA', 'RATE', 'AUTH', 'SCHEMA'))}_{rng.choice(_WORDS).upper()}_{k}"
    word = rng.choice(_WORDS)
    out = (
        f"$ curl -sS -i -X POST https://api.internal.example.com/v2/{word}/sync -d @batch.json\n"
        "HTTP/1.1 429 Too Many Requests\ncontent-type: application/json\nretry-after: 30\n"
        f"x-request-id: req_{_hex(rng, 12)}\n\n"
        + json.dumps(
            {"error": {"code": code, "message": f"{word} sync refused", "retryable": True}}
        )
        + "\n"
    )
    return "bash", out, code


def _traceback(rng: random.Random, k: int) -> tuple[str, str, str]:
    table = rng.choice(_WORDS)
    constraint = f"{table}_external_id_key_{k}"
    out = (
        f"$ python manage.py import_{table} data/{table}-2025-11.csv\n"
        f"Importing {rng.randint(1000, 90000)} rows into {table}\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/app/manage.py", line 22, in <module>\n    main()\n'
        f'  File "/srv/app/{table}/importer.py", line {rng.randint(20, 300)}, in import_rows\n'
        "    cursor.executemany(INSERT_SQL, batch)\n"
        "psycopg.errors.UniqueViolation: duplicate key value violates unique constraint "
        f'"{constraint}"\nDETAIL:  Key (external_id)=({rng.randint(10**5, 10**6)}) already exists.\n'
        "$ echo $?\n1\n"
    )
    return "bash", out, constraint


def _bisect(rng: random.Random, k: int) -> tuple[str, str, str]:
    bad = _hex(rng)
    lines = [f"$ git bisect run pytest -q tests/test_{rng.choice(_WORDS)}.py"]
    for _ in range(rng.randint(3, 6)):
        lines.append(
            f"running 'pytest' '-q'\n{rng.randint(40, 200)} passed in {rng.uniform(1, 9):.2f}s"
        )
        lines.append(
            f"Bisecting: {rng.randint(2, 60)} revisions left to test after this (roughly {rng.randint(1, 6)} steps)"
        )
        lines.append(
            f"[{_hex(rng, 40)}] {rng.choice(('Refactor', 'Tidy', 'Speed up'))} {rng.choice(_WORDS)} export"
        )
    lines.append(f"{bad}{_hex(rng, 33)} is the first bad commit")
    lines.append(
        f"commit {bad}{_hex(rng, 33)}\nAuthor: Sam Lee <sam@example.com>\n\n    Cache {rng.choice(_WORDS)} totals per tenant\n"
    )
    lines.append("bisect found first bad commit")
    return "bash", "\n".join(lines), bad


def _diff(rng: random.Random, k: int) -> tuple[str, str, str]:
    name = f"{rng.choice(_SERVICES).upper()}_TIMEOUT_MS_{k}"
    value = rng.choice((750, 1500, 2500, 4000, 9000))
    setting = f"{name}={value}"
    out = (
        "$ git diff deploy/prod.env\n"
        "diff --git a/deploy/prod.env b/deploy/prod.env\n"
        f"index {_hex(rng)}..{_hex(rng)} 100644\n--- a/deploy/prod.env\n+++ b/deploy/prod.env\n"
        f"@@ -{rng.randint(3, 40)},6 +{rng.randint(3, 40)},6 @@\n LOG_LEVEL=info\n"
        f"-{name}={value * 4}\n+{setting}\n SENTRY_SAMPLE_RATE=0.1\n"
    )
    return "bash", out, setting


def _psql(rng: random.Random, k: int) -> tuple[str, str, str]:
    table = f"{rng.choice(_WORDS)}_archive_{2020 + k % 6}_{k}"
    out = (
        '$ psql "postgresql://app@db-primary.internal:5432/shop"\n'
        "psql (16.4, server 15.8)\nshop=> SELECT status, count(*) FROM orders GROUP BY status;\n"
        "  status  | count\n----------+--------\n"
        f" paid     | {rng.randint(10**5, 10**6)}\n refunded | {rng.randint(10**3, 10**4)}\n(2 rows)\n\n"
        f"shop=> INSERT INTO {table} SELECT * FROM orders WHERE created_at < '2025-01-01';\n"
        f'ERROR:  relation "{table}" does not exist\n'
        f"LINE 1: INSERT INTO {table} SELECT * FROM orders WHERE created_at ...\n"
    )
    return "bash", out, table


def _pytest(rng: random.Random, k: int) -> tuple[str, str, str]:
    word = rng.choice(_WORDS)
    test = f"test_{word}_rounding_{k}"
    passed = rng.randint(80, 400)
    lines = [
        f"$ pytest -q tests/test_{word}.py",
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
        f"collected {passed + 1} items",
        "",
        f"tests/test_{word}.py " + "." * 60 + "F" + "." * 10 + "  [100%]",
        "",
        "=================================== FAILURES ===================================",
        f"____________________________ {test} _____________________________",
        f">       assert total == Decimal('{rng.randint(10, 999)}.10')",
        f"E       AssertionError: assert Decimal('{rng.randint(10, 999)}.09') == Decimal('0.10')",
        "=========================== short test summary info ============================",
        f"FAILED tests/test_{word}.py::{test} - AssertionError",
        f"========================= 1 failed, {passed} passed in {rng.uniform(2, 30):.2f}s =========================",
    ]
    return "bash", "\n".join(lines), test


def _kubectl(rng: random.Random, k: int) -> tuple[str, str, str]:
    pod = f"{rng.choice(_SERVICES)}-worker-{_hex(rng, 10)}-{_hex(rng, 5)}"
    lines = [
        "$ kubectl get pods -n shop",
        "NAME                                  READY   STATUS             RESTARTS   AGE",
    ]
    for _ in range(rng.randint(3, 6)):
        lines.append(
            f"{rng.choice(_SERVICES)}-{_hex(rng, 10)}-{_hex(rng, 5)}   1/1     Running            0          {rng.randint(1, 9)}d"
        )
    lines.append(
        f"{pod}   0/1     CrashLoopBackOff   {rng.randint(5, 40)}         {rng.randint(10, 59)}m"
    )
    lines.append(f"$ kubectl describe pod {pod} -n shop | grep -A3 'Last State'")
    lines.append(
        "    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137"
    )
    return "bash", "\n".join(lines), pod


def _pip(rng: random.Random, k: int) -> tuple[str, str, str]:
    package = _PACKAGES[k % len(_PACKAGES)]
    version = f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{k}"
    out = (
        f"$ pip install -U {package}\nCollecting {package}\n"
        f"  Downloading {package}-{version}-py3-none-any.whl ({rng.randint(80, 900)} kB)\n"
        f"Installing collected packages: {package}\n  Attempting uninstall: {package}\n"
        f"Successfully installed {package}-{version}\n"
    )
    return "bash", out, f"{package}-{version}"


_TOOL_FACTS = (_json_error, _traceback, _bisect, _diff, _psql, _pytest, _kubectl, _pip)

# --- noise: the same tools, succeeding -----------------------------------------------------------


def _noise(rng: random.Random, chars: int) -> tuple[str, str, str]:
    kind = rng.choice(("code", "json", "tests", "git", "kubectl"))
    if kind == "code":
        path = f"src/{rng.choice(_WORDS)}/{rng.choice(('service', 'models', 'views'))}.py"
        return "read_file", json.dumps({"path": path}), _code(rng, chars, path)
    if kind == "json":
        word = rng.choice(_WORDS)
        return (
            "http_get",
            json.dumps({"url": f"https://api.internal.example.com/v2/{word}?page=1"}),
            "HTTP/1.1 200 OK\ncontent-type: application/json\n\n" + _json(rng, chars),
        )
    if kind == "tests":
        word = rng.choice(_WORDS)
        n = rng.randint(40, 300)
        dots = "\n".join(
            f"tests/test_{word}_{i}.py " + "." * 70 for i in range(max(1, chars // 90))
        )
        return (
            "bash",
            json.dumps({"command": f"pytest -q tests/test_{word}.py"}),
            f"{dots}\n{n} passed in {rng.uniform(1, 20):.2f}s\n",
        )
    if kind == "git":
        log = "\n".join(
            f"{_hex(rng)} {rng.choice(('Fix', 'Add', 'Tidy', 'Bump'))} {rng.choice(_WORDS)} "
            f"{rng.choice(('export', 'totals', 'retry', 'docs'))}"
            for _ in range(max(3, chars // 40))
        )
        return "bash", json.dumps({"command": "git log --oneline -50"}), log
    pods = "\n".join(
        f"{rng.choice(_SERVICES)}-{_hex(rng, 10)}-{_hex(rng, 5)}   1/1     Running   0   {rng.randint(1, 30)}d"
        for _ in range(max(3, chars // 60))
    )
    return "bash", json.dumps({"command": "kubectl get pods -n shop"}), pods


_ASKS = (
    "Run the {word} import again and tell me what fails.",
    "Check why the {word} sync job keeps failing on staging.",
    "Look at the failing {word} tests.",
    "Find out which commit broke the {word} export.",
    "Can you check the {word} worker pods?",
    "Bump the dependencies of the {word} service.",
)
_REPLIES = (
    "Checked it; details are in the output above.",
    "Done, see the output.",
    "That run finished; I will keep going with the next step.",
)


def generate_realistic_session(
    *, turns: int = 160, seed: int = 11, target_tokens: int = 300_000
) -> RealisticSession:
    rng = random.Random(seed)
    system = (
        "You are an operations agent with a shell. Run commands, read their output, fix problems."
    )
    events: list[dict[str, Any]] = [{"type": "SYSTEM_PROMPT", "content": system}]
    facts: list[str] = []
    fact_events: dict[str, int] = {}
    slots = sorted(rng.sample(range(2, int(turns * 0.8)), 24))
    plan: dict[int, str] = {}
    kinds = (
        [f"tool{i % 8}" for i in range(16)] + ["decision"] * 4 + ["constraint"] * 3 + ["setting"]
    )
    for turn, kind in zip(slots, kinds, strict=True):
        plan[turn] = kind
    correction_turn = int(turns * 0.9)
    per_turn_chars = int(target_tokens * _CPT / turns)
    for turn in range(turns):
        word = rng.choice(_WORDS)
        kind = plan.get(turn, "")
        user = rng.choice(_ASKS).format(word=word)
        if kind == "constraint":
            module = f"{word}_legacy_{rng.randint(100, 999)}"
            user += f" Never modify the {module} module; other teams depend on it."
            facts.append(module)
        if turn == correction_turn:
            user = (
                "Correction: WORKER_CONCURRENCY=4, not 8. The staging nodes only have 4 cores, so "
                "set it back before the next deploy."
            )
            facts.append("WORKER_CONCURRENCY=4")
        events.append({"type": "USER_MESSAGE", "content": user})
        if kind == "constraint" or turn == correction_turn:
            fact_events[facts[-1]] = len(events) - 1
        calls: list[tuple[str, str, str]] = []
        if kind.startswith("tool"):
            ordinal = sum(1 for k in kinds[: slots.index(turn)] if k.startswith("tool"))
            name, out, key = _TOOL_FACTS[int(kind[4:])](rng, ordinal)
            command = out.splitlines()[0].removeprefix("$ ")
            calls.append((name, json.dumps({"command": command}), out))
            facts.append(key)
        budget = max(400, int(per_turn_chars * min(3.0, rng.lognormvariate(-0.2, 0.6))))
        for _ in range(rng.randint(1, 2)):
            calls.append(_noise(rng, budget // 2))
        for k, (name, args, out) in enumerate(calls):
            call_id = f"call_{turn:04d}_{k}"
            events.append(
                {"type": "TOOL_CALL", "name": name, "toolCallId": call_id, "content": args}
            )
            events.append(
                {"type": "TOOL_RESULT", "name": name, "toolCallId": call_id, "content": out}
            )
            if k == 0 and kind.startswith("tool"):
                fact_events[facts[-1]] = len(events) - 1
        reply = rng.choice(_REPLIES)
        if kind == "decision":
            lock = f"{rng.choice(('Tenant', 'Ledger', 'Payout'))}Lock{rng.randint(100, 9999)}"
            reply = f"We decided to use {lock} instead of a table lock for the {word} job. " + reply
            facts.append(lock)
        if kind == "setting":
            reply = (
                "I set WORKER_CONCURRENCY=8 in deploy/worker.env so the import runs in parallel. "
                + reply
            )
        events.append({"type": "AGENT_MESSAGE", "content": reply})
        if kind == "decision":
            fact_events[facts[-1]] = len(events) - 1
    approx = sum(len(e["content"]) for e in events) / _CPT
    return RealisticSession(
        events=events,
        facts=facts,
        approx_tokens=int(approx),
        fact_events=fact_events,
        stale=["WORKER_CONCURRENCY=8"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--turns", type=int, default=160)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--target-tokens", type=int, default=300_000)
    args = parser.parse_args(argv)
    session = generate_realistic_session(
        turns=args.turns, seed=args.seed, target_tokens=args.target_tokens
    )
    lines = write_jsonl(args.out, session.events)
    print(
        f"wrote {lines} messages (~{session.approx_tokens} tokens, {len(session.facts)} facts)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
