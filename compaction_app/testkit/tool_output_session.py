"""Sessions that bury one real tool output in a long run of routine output, for the evidence
tests and `bench_evidence.py`.

The outputs and the facts each must keep live in `tests/fixtures/tool_outputs/` (`name.txt`
as the tool prints it, `name.facts` one fact a line; the family is the name up to its first
`_`). `SPLIT` beside them puts each output in the `tune` or the `sealed` half (`split_rule()`
writes it): selection is tuned on the first half only, the second is looked at on purpose, to
see whether what was tuned carries over to outputs it was not tuned on. The routine around them is written here: the same few tools succeeding again and again
with other timestamps, request ids, hashes and durations, as a long agent session looks. A
fact counts as kept when its text, blanks collapsed, appears in the context after compaction.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CORPUS",
    "SPLITS",
    "Fixture",
    "anthropic_request",
    "anthropic_text",
    "buried_session",
    "chat_messages",
    "facts_kept",
    "load_corpus",
    "read_split",
    "split_rule",
]

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "tool_outputs"


@dataclass(frozen=True)
class Fixture:
    name: str
    family: str
    text: str
    facts: tuple[str, ...]


SPLITS = ("tune", "sealed")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_rule(names: list[str]) -> dict[str, str]:
    """Each output's half, by a fixed rule: within a family, the outputs in the order of the
    hash of their names take turns (the hash of the family's name says which half goes
    first), so every family with two or more outputs is in both halves and old and new
    outputs mix by chance, not by choice."""
    families: dict[str, list[str]] = defaultdict(list)
    for name in names:
        families[name.split("_", 1)[0]].append(name)
    halves: dict[str, str] = {}
    for family, members in families.items():
        first = int(_digest(family), 16) % 2
        for rank, name in enumerate(sorted(members, key=_digest)):
            halves[name] = SPLITS[(rank + first) % 2]
    return halves


def read_split(directory: Path = CORPUS) -> dict[str, str]:
    """The halves written in `SPLIT` (`name half` a line; `#` starts a comment)."""
    halves: dict[str, str] = {}
    for line in (directory / "SPLIT").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, half = line.split()
            halves[name] = half
    return halves


def load_corpus(directory: Path = CORPUS, split: str | None = None) -> list[Fixture]:
    """The corpus's outputs, sorted by name: all of them, or only the `tune` or the
    `sealed` half."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, not {split!r}")
    halves = read_split(directory) if split is not None else {}
    fixtures = []
    for path in sorted(directory.glob("*.txt")):
        if split is not None and halves.get(path.stem) != split:
            continue
        facts = path.with_suffix(".facts").read_text().splitlines()
        fixtures.append(
            Fixture(
                name=path.stem,
                family=path.stem.split("_", 1)[0],
                text=path.read_text(),
                facts=tuple(f for f in facts if f.strip()),
            )
        )
    return fixtures


def _blanks(text: str) -> str:
    return " ".join(text.split())


def facts_kept(context_text: str, facts: tuple[str, ...] | list[str]) -> list[str]:
    haystack = _blanks(context_text)
    return [fact for fact in facts if _blanks(fact) in haystack]


# --- routine output ------------------------------------------------------------------------------

_ROUTES = ["/api/cart", "/api/cart/items", "/api/orders", "/api/health", "/api/catalog"]
_MODULES = ["cart", "orders", "catalog", "search", "accounts", "shipping"]


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _app_log(rng: random.Random) -> tuple[str, str]:
    lines = []
    minute = rng.randrange(60)
    for _ in range(rng.randrange(12, 30)):
        lines.append(
            f"2026-11-20T10:{minute:02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z INFO  "
            f"request_id=req_{_hex(rng, 12)} method=GET path={rng.choice(_ROUTES)} status=200 "
            f"duration_ms={rng.randrange(3, 80)}"
        )
    return "tail -n 30 /var/log/app/app.log", "\n".join(lines)


def _unit_tests(rng: random.Random) -> tuple[str, str]:
    module = rng.choice(_MODULES)
    count = rng.randrange(20, 90)
    dots = "." * count
    return (
        f"pytest tests/{module} -q",
        f"{dots:<72} [100%]\n{count} passed in {rng.uniform(0.8, 9.5):.2f}s",
    )


def _git_status(rng: random.Random) -> tuple[str, str]:
    return (
        "git status",
        "On branch main\nYour branch is up to date with 'origin/main'.\n\n"
        "nothing to commit, working tree clean",
    )


def _build(rng: random.Random) -> tuple[str, str]:
    return (
        "npm run build",
        "> shop-web@3.2.0 build\n> vite build\n\nvite v5.4.8 building for production...\n"
        f"✓ {rng.randrange(400, 420)} modules transformed.\n"
        f"dist/index.html                   0.{rng.randrange(40, 60)} kB │ gzip: 0.31 kB\n"
        f"dist/assets/index-{_hex(rng, 8)}.css   {rng.randrange(10, 20)}.{rng.randrange(99)} kB │ gzip: 3.90 kB\n"
        f"dist/assets/index-{_hex(rng, 8)}.js   {rng.randrange(140, 150)}.{rng.randrange(99)} kB │ gzip: 45.12 kB\n"
        f"✓ built in {rng.uniform(2, 5):.2f}s",
    )


def _pods(rng: random.Random) -> tuple[str, str]:
    rows = ["NAME                              READY   STATUS    RESTARTS   AGE"]
    for name in ("cart-api", "orders-api", "catalog-api", "search-indexer"):
        for _ in range(2):
            rows.append(
                f"{name}-{_hex(rng, 9)}-{_hex(rng, 5)}   1/1     Running   0          "
                f"{rng.randrange(1, 9)}d"
            )
    return "kubectl get pods -n shop", "\n".join(rows)


def _pip_ok(rng: random.Random) -> tuple[str, str]:
    packages = ["requests", "urllib3", "idna", "certifi", "charset-normalizer", "attrs"]
    return (
        "pip install -r requirements-dev.txt",
        "\n".join(
            f"Requirement already satisfied: {p} in ./.venv/lib/python3.12/site-packages "
            f"(from -r requirements-dev.txt (line {i + 1})) ({rng.randrange(1, 3)}.{rng.randrange(30)}.{rng.randrange(9)})"
            for i, p in enumerate(packages)
        ),
    )


def _read_source(rng: random.Random) -> tuple[str, str]:
    module = rng.choice(_MODULES)
    body = "\n".join(
        [
            "from decimal import Decimal",
            "",
            f"from shop.{module}.models import Line",
            "",
            "",
            f"def total_{module}(lines: list[Line]) -> Decimal:",
            '    """Sum of the lines, rounded per line."""',
            "    total = Decimal(0)",
            "    for line in lines:",
            "        total += line.unit_price * line.quantity",
            "    return total",
        ]
    )
    return f"cat src/shop/{module}/totals.py", body


_ROUTINE = [_app_log, _unit_tests, _git_status, _build, _pods, _pip_ok, _read_source]
_AGENT_ROUTINE = [
    "The build is green; moving on to the next module.",
    "Tests pass locally. Checking the logs next.",
    "All pods are running. Nothing unusual in the output.",
    "Dependencies are already installed.",
]


def buried_session(
    fixture: Fixture | list[Fixture], *, routine: int = 150, seed: int = 11
) -> list[dict[str, Any]]:
    """Events (REST shape) of a session whose middle tool results are the outputs of
    `fixture` (one, or several spread over the middle), with `routine` routine tool results
    around them and one user request at the start."""
    fixtures = fixture if isinstance(fixture, list) else [fixture]
    rng = random.Random(f"{seed}:{':'.join(f.name for f in fixtures)}")
    events: list[dict[str, Any]] = [
        {"type": "SYSTEM_PROMPT", "content": "You are an operations agent with a shell tool."},
        {
            "type": "USER_MESSAGE",
            "content": "Keep the shop healthy today: watch the builds, tests and the cluster.",
        },
    ]
    # Outputs at evenly spaced turns of the middle 80 %: never among the kept newest events.
    span = routine * 8 // 10
    planted = {
        routine // 10 + (k + 1) * span // (len(fixtures) + 1): f for k, f in enumerate(fixtures)
    }
    for turn in range(routine + 1):
        if turn in planted:
            text = planted[turn].text
            command, output = text.split("\n", 1)[0].lstrip("$ "), text
        else:
            command, output = rng.choice(_ROUTINE)(rng)
            output = f"$ {command}\n{output}"
        call_id = f"call_{turn}"
        events.append(
            {
                "type": "TOOL_CALL",
                "name": "bash",
                "toolCallId": call_id,
                "content": '{"command": "'
                + command.replace("\\", "\\\\").replace('"', '\\"')
                + '"}',
            }
        )
        events.append(
            {"type": "TOOL_RESULT", "name": "bash", "toolCallId": call_id, "content": output}
        )
        if turn % 5 == 4:
            events.append({"type": "AGENT_MESSAGE", "content": rng.choice(_AGENT_ROUTINE)})
    events.append({"type": "USER_MESSAGE", "content": "What is the state now?"})
    events.append({"type": "AGENT_MESSAGE", "content": "Summarizing the day so far."})
    return events


def chat_messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` (REST shape) as a client sends them on the OpenAI Chat Completions wire: each
    tool call an assistant message with its `tool_calls`, each result a `tool` message."""
    roles = {"SYSTEM_PROMPT": "system", "USER_MESSAGE": "user", "AGENT_MESSAGE": "assistant"}
    messages: list[dict[str, Any]] = []
    for event in events:
        if event["type"] == "TOOL_CALL":
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
        elif event["type"] == "TOOL_RESULT":
            messages.append(
                {"role": "tool", "tool_call_id": event["toolCallId"], "content": event["content"]}
            )
        else:
            messages.append({"role": roles[event["type"]], "content": event["content"]})
    return messages


CLAUDE_CODE_SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."
EPHEMERAL = {"type": "ephemeral"}


def anthropic_request(
    events: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`events` (REST shape) as Claude Code sends them on the Anthropic Messages wire:
    (system, messages). The system prompt is two text blocks, each with a `cache_control`
    breakpoint; each tool call is a `tool_use` block of an assistant message and each result a
    `tool_result` block of a user message, turns of one role merged into one message; the
    last user message's last block carries the moving breakpoint."""
    system: list[dict[str, Any]] = [
        {"type": "text", "text": CLAUDE_CODE_SYSTEM, "cache_control": EPHEMERAL}
    ]
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for event in events:
        kind = event["type"]
        if kind == "SYSTEM_PROMPT":
            system.append({"type": "text", "text": event["content"], "cache_control": EPHEMERAL})
        elif kind == "USER_MESSAGE":
            add("user", {"type": "text", "text": event["content"]})
        elif kind == "AGENT_MESSAGE":
            add("assistant", {"type": "text", "text": event["content"]})
        elif kind == "TOOL_CALL":
            block = {
                "type": "tool_use",
                "id": event["toolCallId"],
                "name": event["name"],
                "input": json.loads(event["content"]),
            }
            add("assistant", block)
        elif kind == "TOOL_RESULT":
            add(
                "user",
                {
                    "type": "tool_result",
                    "tool_use_id": event["toolCallId"],
                    "content": event["content"],
                },
            )
    for message in reversed(messages):
        if message["role"] == "user":
            message["content"][-1]["cache_control"] = EPHEMERAL
            break
    return system, messages


def anthropic_text(body: dict[str, Any]) -> str:
    """The text a model reads in a Messages request body: system blocks, text, tool
    results and tool inputs."""
    parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        parts.append(system)
    elif isinstance(system, list):
        parts += [block.get("text", "") for block in system]
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
            continue
        for block in content or []:
            if block.get("type") == "text":
                parts.append(block["text"])
            elif block.get("type") == "tool_use":
                parts.append(json.dumps(block.get("input")))
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, str):
                    parts.append(inner)
                else:
                    parts += [b.get("text", "") for b in inner or [] if isinstance(b, dict)]
    return "\n".join(parts)
