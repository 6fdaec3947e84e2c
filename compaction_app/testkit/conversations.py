"""Whole agent conversations with the facts a person continuing the work must know, for the
conversation tests and `bench_conversations.py`.

Each scenario is a hand-written `name.conv` in `tests/fixtures/conversations/`: a coding or
operations agent's session as its client records it (system prompt, the user's requests, the
assistant's words, tool calls with JSON arguments and the tools' real-looking output), the
facts that session produced (literal strings of it), and the routine of its domain: the same
tools succeeding again and again, written as templates. `long_session()` interleaves that
routine between the scenario's fact-bearing turns, deterministically from a seed, until the
session reaches a chosen size in tokens. A fact counts as kept when its text, blanks
collapsed, appears in the context after compaction (`facts_kept`).

`SPLIT` beside the scenarios puts each in the `tune` or the `sealed` half (`split_rule()`
writes it): selection may be looked at on the first half; the second stays sealed, to see
whether what was tuned carries over to conversations it was never tuned on.

The `.conv` format: a line starting with `@@@ ` opens a section, everything up to the next
such line is its body (a trailing blank line is dropped).

- `@@@ meta` — `key: value` lines (`title`, `domain`, `start`: the ISO time the routine's
  clock starts at).
- `@@@ system`, `@@@ user`, `@@@ assistant` — a message.
- `@@@ call TOOL` — a tool call; its body is the call's JSON arguments. `@@@ result` — the
  output of the call before it.
- `@@@ facts` — one fact a line, each a literal of the scenario's messages.
- `@@@ routine TOOL` — a routine tool call: the first body line is its JSON arguments, the
  rest its output. Both are templates: `⟦hex:N⟧` (N hex digits), `⟦int:A:B⟧`,
  `⟦float:A:B:D⟧` (D decimals), `⟦uuid⟧`, `⟦ts⟧` (ISO time with milliseconds, the session's
  clock moving on a little at each use), `⟦clock⟧` (HH:MM:SS of that clock), `⟦date⟧`,
  `⟦epoch⟧`, `⟦choice:a|b|c⟧`; a line starting with `⟦*A:B⟧` is repeated A to B times.
- `@@@ notes` — the agent's routine remarks, one a line.
- `@@@ nudges` — the user's routine interjections, one a line.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compaction_app.testkit import tool_output_session
from compaction_app.testkit.tool_output_session import SPLITS, chat_messages, facts_kept

__all__ = [
    "CORPUS",
    "SPLITS",
    "Routine",
    "Scenario",
    "chat_messages",
    "event_tokens",
    "facts_kept",
    "load_scenarios",
    "long_session",
    "parse_scenario",
    "read_split",
    "render_routine",
    "split_rule",
]

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "conversations"
SECTION = "@@@ "
MODEL = "gpt-4o"
CLOSING = "Pick this up where we left off: what have we established so far, and what is next?"


@dataclass(frozen=True)
class Routine:
    tool: str
    arguments: str
    output: str


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    domain: str
    start: dt.datetime
    events: tuple[dict[str, Any], ...]
    facts: tuple[str, ...]
    routines: tuple[Routine, ...]
    notes: tuple[str, ...] = ()
    nudges: tuple[str, ...] = ()
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """Everything the scenario's own messages say (calls' arguments included)."""
        return "\n".join(event["content"] for event in self.events)


# --- parsing -------------------------------------------------------------------------------------

_TYPES = {"system": "SYSTEM_PROMPT", "user": "USER_MESSAGE", "assistant": "AGENT_MESSAGE"}


def _sections(text: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(SECTION):
            sections.append((line[len(SECTION) :].strip(), []))
        elif sections:
            sections[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"text before the first section: {line!r}")
    out = []
    for head, body in sections:
        while body and not body[-1].strip():
            body.pop()
        out.append((head, "\n".join(body)))
    return out


def parse_scenario(name: str, text: str) -> Scenario:
    """A scenario from the text of its `.conv` file."""
    events: list[dict[str, Any]] = []
    facts: list[str] = []
    routines: list[Routine] = []
    notes: list[str] = []
    nudges: list[str] = []
    meta: dict[str, str] = {}
    calls = 0
    pending: dict[str, Any] | None = None
    for head, body in _sections(text):
        kind, _, rest = head.partition(" ")
        if kind == "meta":
            for line in body.splitlines():
                if line.strip():
                    key, _, value = line.partition(":")
                    meta[key.strip()] = value.strip()
        elif kind in _TYPES:
            events.append({"type": _TYPES[kind], "content": body})
        elif kind == "call":
            calls += 1
            arguments = json.dumps(json.loads(body))  # one line, as clients send them
            pending = {
                "type": "TOOL_CALL",
                "name": rest.strip(),
                "toolCallId": f"call_{name}_{calls:03d}",
                "content": arguments,
            }
            events.append(pending)
        elif kind == "result":
            if pending is None:
                raise ValueError(f"{name}: a result without its call")
            events.append(
                {
                    "type": "TOOL_RESULT",
                    "name": pending["name"],
                    "toolCallId": pending["toolCallId"],
                    "content": body,
                }
            )
            pending = None
        elif kind == "facts":
            facts += [line.strip() for line in body.splitlines() if line.strip()]
        elif kind == "routine":
            arguments, _, output = body.partition("\n")
            routines.append(Routine(tool=rest.strip(), arguments=arguments, output=output))
        elif kind == "notes":
            notes += [line.strip() for line in body.splitlines() if line.strip()]
        elif kind == "nudges":
            nudges += [line.strip() for line in body.splitlines() if line.strip()]
        else:
            raise ValueError(f"{name}: unknown section {head!r}")
    start = dt.datetime.fromisoformat(meta.get("start", "2026-03-02T09:00:00+00:00"))
    return Scenario(
        name=name,
        title=meta.get("title", name),
        domain=meta.get("domain", ""),
        start=start,
        events=tuple(events),
        facts=tuple(facts),
        routines=tuple(routines),
        notes=tuple(notes),
        nudges=tuple(nudges),
        meta=meta,
    )


# --- the split -----------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_rule(names: Sequence[str]) -> dict[str, str]:
    """Each scenario's half, by a fixed rule: the scenarios in the order of the SHA-256 of
    their names take turns, the first `tune`; half each (the odd one out `tune`)."""
    return {name: SPLITS[rank % 2] for rank, name in enumerate(sorted(names, key=_digest))}


def read_split(directory: Path = CORPUS) -> dict[str, str]:
    """The halves written in `SPLIT`, in the tool-output corpus's format (one reader)."""
    return tool_output_session.read_split(directory)


def load_scenarios(directory: Path = CORPUS, split: str | None = None) -> list[Scenario]:
    """The corpus's scenarios, sorted by name: all of them, or only one half."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, not {split!r}")
    halves = read_split(directory) if split is not None else {}
    scenarios = []
    for path in sorted(directory.glob("*.conv")):
        if split is not None and halves.get(path.stem) != split:
            continue
        scenarios.append(parse_scenario(path.stem, path.read_text()))
    return scenarios


# --- routine -------------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"⟦([^⟧]*)⟧")
_REPEAT = re.compile(r"^⟦\*(\d+):(\d+)⟧")


class _Clock:
    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def tick(self, rng: random.Random, low_ms: int = 5, high_ms: int = 2500) -> dt.datetime:
        self.now += dt.timedelta(milliseconds=rng.randrange(low_ms, high_ms))
        return self.now


def _fill(template: str, rng: random.Random, clock: _Clock) -> str:
    def value(match: re.Match[str]) -> str:
        kind, _, spec = match.group(1).partition(":")
        args = spec.split(":") if spec else []
        if kind == "hex":
            return "".join(rng.choice("0123456789abcdef") for _ in range(int(args[0])))
        if kind == "int":
            return str(rng.randint(int(args[0]), int(args[1])))
        if kind == "float":
            number = rng.uniform(float(args[0]), float(args[1]))
            return f"{number:.{int(args[2]) if len(args) > 2 else 2}f}"
        if kind == "uuid":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if kind == "ts":
            now = clock.tick(rng)
            return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
        if kind == "clock":
            return clock.tick(rng).strftime("%H:%M:%S")
        if kind == "date":
            return clock.now.strftime("%Y-%m-%d")
        if kind == "epoch":
            return str(int(clock.tick(rng).timestamp()))
        if kind == "choice":
            return rng.choice(spec.split("|"))
        raise ValueError(f"unknown placeholder {match.group(0)}")

    lines: list[str] = []
    for line in template.split("\n"):
        repeat = _REPEAT.match(line)
        if repeat:
            body = line[repeat.end() :]
            for _ in range(rng.randint(int(repeat.group(1)), int(repeat.group(2)))):
                lines.append(_PLACEHOLDER.sub(value, body))
        else:
            lines.append(_PLACEHOLDER.sub(value, line))
    return "\n".join(lines)


def render_routine(
    routine: Routine, rng: random.Random, clock: _Clock | None = None
) -> tuple[str, str]:
    """(JSON arguments, output) of one routine call, placeholders filled from `rng`."""
    clock = clock or _Clock(dt.datetime(2026, 3, 2, 9, tzinfo=dt.UTC))
    arguments = json.dumps(json.loads(_fill(routine.arguments, rng, clock)))
    return arguments, _fill(routine.output, rng, clock)


# --- long sessions -------------------------------------------------------------------------------

_ROLES = {
    "SYSTEM_PROMPT": "system",
    "USER_MESSAGE": "user",
    "AGENT_MESSAGE": "assistant",
    "TOOL_CALL": "assistant",
    "TOOL_RESULT": "tool",
}


def event_tokens(events: Sequence[dict[str, Any]], model: str = MODEL) -> int:
    """The events' tokens as the ledger counts messages (`message_tokens`: overhead, role,
    content, name) with `model`'s counter."""
    from sessions_app.tokens import counter_for_model, messages_batch_tokens

    counter = counter_for_model(model)
    triples = [(_ROLES[e["type"]], e["content"], e.get("name", "")) for e in events]
    return sum(messages_batch_tokens(counter, triples))


def _units(events: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The scenario's events cut where routine may go in: before each user message and each
    tool call, except that a call stays with the agent's words announcing it, and a result
    stays with its call and the agent's reaction to it."""
    units: list[list[dict[str, Any]]] = []
    for event in events:
        kind = event["type"]
        previous = units[-1][-1]["type"] if units else None
        announcing = (
            kind == "TOOL_CALL"
            and previous == "AGENT_MESSAGE"
            and len(units[-1]) >= 1
            and (len(units[-1]) < 2 or units[-1][-2]["type"] != "TOOL_RESULT")
        )
        if not units or kind == "USER_MESSAGE" or (kind == "TOOL_CALL" and not announcing):
            units.append([event])
        else:
            units[-1].append(event)
    return units


def _routine_block(
    scenario: Scenario, rng: random.Random, clock: _Clock, number: int
) -> list[dict[str, Any]]:
    routine = rng.choice(scenario.routines)
    arguments, output = render_routine(routine, rng, clock)
    call_id = f"call_r{number:05d}_{''.join(rng.choice('0123456789abcdef') for _ in range(6))}"
    block: list[dict[str, Any]] = [
        {"type": "TOOL_CALL", "name": routine.tool, "toolCallId": call_id, "content": arguments},
        {"type": "TOOL_RESULT", "name": routine.tool, "toolCallId": call_id, "content": output},
    ]
    if scenario.notes and rng.random() < 0.3:
        block.append({"type": "AGENT_MESSAGE", "content": rng.choice(scenario.notes)})
    if scenario.nudges and rng.random() < 0.02:
        block.append({"type": "USER_MESSAGE", "content": rng.choice(scenario.nudges)})
    clock.tick(rng, 2_000, 90_000)
    return block


def long_session(
    scenario: Scenario, *, tokens: int = 400_000, seed: int = 1, model: str = MODEL
) -> list[dict[str, Any]]:
    """Events (REST shape) of `scenario` grown to about `tokens` tokens (`event_tokens`, at
    least `tokens`, over by at most one routine call): its system prompt, then its turns with
    routine calls spread evenly between them and after the last, then a closing user
    message. The same scenario, size and seed give the same events."""
    from sessions_app.tokens import counter_for_model, messages_batch_tokens

    counter = counter_for_model(model)
    rng = random.Random(f"{seed}:{scenario.name}")
    clock = _Clock(scenario.start)
    head = [e for e in scenario.events if e["type"] == "SYSTEM_PROMPT"]
    body = [e for e in scenario.events if e["type"] != "SYSTEM_PROMPT"]
    units = _units(body)
    closing = {"type": "USER_MESSAGE", "content": CLOSING}
    fixed = event_tokens([*head, *body, closing], model)
    blocks: list[list[dict[str, Any]]] = []
    total = fixed
    while total < tokens:
        block = _routine_block(scenario, rng, clock, len(blocks))
        triples = [(_ROLES[e["type"]], e["content"], e.get("name", "")) for e in block]
        total += sum(messages_batch_tokens(counter, triples))
        blocks.append(block)
    # Block i goes after unit i × len(units) // len(blocks): every gap, the tail included,
    # gets its even share.
    gaps: list[list[dict[str, Any]]] = [[] for _ in units]
    for i, block in enumerate(blocks):
        gaps[i * len(units) // len(blocks)] += block
    events: list[dict[str, Any]] = [dict(e) for e in head]
    for unit, gap in zip(units, gaps, strict=True):
        events += [dict(e) for e in unit]
        events += gap
    events.append(closing)
    return events
