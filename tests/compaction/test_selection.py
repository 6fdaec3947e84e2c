"""What a compaction keeps: the agent's own conclusions by structure, values seen once over
repeated ones in any format, the room the target leaves, and earlier evidence across runs.

Pure: the strategies, the local summarizer and the evidence extractor, no database."""

from __future__ import annotations

import json
import random

import pytest

from compaction_app.evidence import loss_report
from compaction_app.strategies import SUMMARY_MESSAGE_OVERHEAD, clear_tool_results, summarize
from compaction_app.summarizers.base import SummaryMessage
from compaction_app.summarizers.local import LocalSummarizer
from compaction_app.types import Budget, Plan, PlanEvent
from sessions_app import tokens

pytestmark = pytest.mark.profile_independent

COUNTER = tokens.get_counter("o200k_base")
ROLES = {
    "SYSTEM_PROMPT": "system",
    "USER_MESSAGE": "user",
    "AGENT_MESSAGE": "assistant",
    "TOOL_CALL": "assistant",
    "TOOL_RESULT": "tool",
    "COMPACTION": "system",
}


class Ledger:
    """A session as the strategies see it, compacted the way a run does (pure)."""

    def __init__(self) -> None:
        self.events: list[PlanEvent] = []
        self.seq = 0
        self.summary = ""
        self.scores: dict[str, int] = {}

    def add(self, type_: str, content: str, *, name: str = "", call: str = "") -> None:
        self.seq += 1
        cost = tokens.message_tokens(COUNTER, role=ROLES[type_], content=content, name=name)
        self.events.append(
            PlanEvent(
                id=f"e{self.seq}",
                seq=self.seq,
                type=type_,
                token_count=cost,
                tool_call_id=call,
                name=name,
                content=content,
            )
        )

    def tool(self, call: str, output: str) -> None:
        self.add("TOOL_CALL", json.dumps({"command": call}), name="bash", call=call)
        self.add("TOOL_RESULT", output, name="bash", call=call)

    @property
    def tokens(self) -> int:
        return sum(e.token_count for e in self.events) + 3

    def compact(self, budget: Budget) -> str:
        plan = summarize(events=self.events, budget=budget)
        folding = set(plan.fold_ids)
        folded = [e for e in self.events if e.id in folding and e.type != "COMPACTION"]
        kept = [e for e in self.events if e.id not in folding]
        freed = sum(e.token_count for e in self.events if e.id in folding)
        writer = LocalSummarizer(count_tokens=COUNTER.count)

        def message(e: PlanEvent) -> SummaryMessage:
            return SummaryMessage(
                event_id=e.id,
                type=e.type,
                role=ROLES[e.type],
                content=e.content,
                name=e.name,
                seq=e.seq,
                tool_call_id=e.tool_call_id,
            )

        # As a run calls it (compaction_app/services.py): the whole conversation beside the
        # folded messages, and the scores the previous summary's items earned.
        self.summary = writer.summarize(
            previous_summary=self.summary,
            messages=[message(e) for e in folded],
            max_tokens=min(
                plan.summary_reserve_tokens - SUMMARY_MESSAGE_OVERHEAD,
                freed - SUMMARY_MESSAGE_OVERHEAD,
            ),
            kept_text="\n".join(e.content for e in kept if e.type != "COMPACTION"),
            context=[message(e) for e in self.events if e.type != "COMPACTION"],
            previous_scores=self.scores,
        )
        self.scores = dict(writer.chosen_scores)
        self.events = kept
        self.add("COMPACTION", self.summary)
        return self.summary

    def text(self) -> str:
        return "\n".join(e.content for e in self.events)


def routine_log(rng: random.Random, lines: int = 20) -> str:
    return "\n".join(
        f"2026-11-20T10:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z INFO "
        f"request_id=req_{rng.getrandbits(48):012x} path=/api/cart status=200 "
        f"duration_ms={rng.randrange(3, 80)}"
        for _ in range(lines)
    )


# --- the agent's own words -----------------------------------------------------------------------

CONCLUSIONS = [
    "The culprit turned out to be the stale DNS cache on node-7.",
    "Latency came back to 180 ms once the pool went to 64 connections.",
    "So the 14-day window stays.",
    "Looks like orders_v2 is the table to migrate, not orders.",
]


def test_it_keeps_the_agents_conclusions_whatever_words_they_use() -> None:
    """Conclusions phrased without any decision word ("decided", "we will", "rolled back")
    are the conversation's reasoning: kept by structure ahead of routine tool output."""
    rng = random.Random(5)
    ledger = Ledger()
    ledger.add("SYSTEM_PROMPT", "You are an operations agent.")
    ledger.add("USER_MESSAGE", "Find out why checkout is slow.")
    for turn in range(40):
        ledger.tool(f"tail-{turn}", routine_log(rng))
        if turn % 10 == 5:
            ledger.add("AGENT_MESSAGE", CONCLUSIONS[turn // 10])
    ledger.add("USER_MESSAGE", "Where are we?")
    ledger.add("AGENT_MESSAGE", "Writing it up.")
    summary = ledger.compact(
        Budget(context_limit=200_000, target_tokens=160_000, max_summary_tokens=400)
    )
    for conclusion in CONCLUSIONS:
        assert conclusion.rstrip(".") in summary, (conclusion, summary)


# --- values seen once, in any format --------------------------------------------------------------


def test_it_quotes_a_value_deep_inside_a_document_printed_on_one_line() -> None:
    rng = random.Random(9)
    document = {
        "items": [
            {"id": f"inv_{k:04d}", "status": "paid", "amount": rng.randrange(100, 999)}
            for k in range(60)
        ],
        "error": {"code": "LEDGER_DRIFT", "batchRunId": "run-7f3e9a21"},
    }
    ledger = Ledger()
    ledger.add("SYSTEM_PROMPT", "You are an operations agent.")
    ledger.add("USER_MESSAGE", "Check the invoices.")
    for turn in range(30):
        ledger.tool(f"tail-{turn}", routine_log(rng))
        if turn == 12:
            ledger.tool("curl", json.dumps(document, separators=(",", ":")))
    ledger.add("USER_MESSAGE", "Where are we?")
    ledger.add("AGENT_MESSAGE", "Writing it up.")
    summary = ledger.compact(
        Budget(context_limit=200_000, target_tokens=160_000, max_summary_tokens=600)
    )
    assert "run-7f3e9a21" in summary
    assert "LEDGER_DRIFT" in summary


def test_it_keeps_in_a_placeholder_the_checksum_that_does_not_match() -> None:
    """A listing of checksums has no line that stands out by its words; the file listed with
    one sum and computed with another is the mismatch, both sides of it, never a checksum
    that is merely seen once (every checksum is)."""
    rng = random.Random(2)
    ledger = Ledger()
    ledger.add("SYSTEM_PROMPT", "You are a release agent.")
    ledger.add("USER_MESSAGE", "Verify the artifacts.")
    for turn in range(12):
        fresh = [f"{rng.getrandbits(256):064x}" for _ in range(12)]
        ledger.tool(
            f"check-{turn}", "\n".join(f"{h}  dist/pkg-{i}.tar.gz" for i, h in enumerate(fresh))
        )
    listed = [f"{rng.getrandbits(256):064x}" for _ in range(9)]
    odd = f"{rng.getrandbits(256):064x}"
    ledger.tool(
        "verify",
        "\n".join(
            [
                *(f"{h}  dist/pkg-{i}.tar.gz" for i, h in enumerate(listed)),
                "--- computed ---",
                *(f"{h}  dist/pkg-{i}.tar.gz" for i, h in enumerate(listed[:8])),
                f"{odd}  dist/pkg-8.tar.gz",
            ]
        ),
    )
    for turn in range(4):
        ledger.tool(f"later-{turn}", routine_log(rng, 3))
    plan = clear_tool_results(
        events=ledger.events,
        # No room below the target: every old output is cleared, none kept whole.
        budget=Budget(context_limit=ledger.tokens, target_tokens=0),
        count_tokens=COUNTER.count,
    )
    placeholders = " ".join(c.placeholder for c in plan.cleared)
    assert odd in placeholders and listed[8] in placeholders
    assert not any(h in placeholders for h in listed[:8])


def test_it_grows_placeholders_into_the_room_clearing_leaves_below_the_target() -> None:
    """With a target far above what clearing leaves, an output keeps more of its lines than
    the records the conversation points at (here none: nobody asked about a shard); with the
    target just reached, it keeps only those."""
    rng = random.Random(4)
    facts = [
        f"shard-{k:02d} lag_ms={rng.randrange(1000, 9999)} owner=team-{rng.randrange(99)}"
        for k in range(40)
    ]
    ledger = Ledger()
    ledger.add("SYSTEM_PROMPT", "You are a database agent.")
    ledger.add("USER_MESSAGE", "Why is replication behind?")
    ledger.tool("lag-report", "\n".join(facts))
    for turn in range(8):
        ledger.tool(f"tail-{turn}", routine_log(rng))

    def plan(target: int) -> Plan:
        return clear_tool_results(
            events=ledger.events,
            budget=Budget(context_limit=ledger.tokens, target_tokens=target),
            count_tokens=COUNTER.count,
        )

    def kept(target: int) -> int:
        cleared = plan(target)
        placeholder = {c.event_id: c.placeholder for c in cleared.cleared}
        seen = " ".join(placeholder.get(e.id, e.content) for e in ledger.events)
        assert cleared.tokens_after <= max(target, cleared.tokens_after)
        return sum(fact in seen for fact in facts)

    tight = kept(1)
    # Room for nearly the whole session: the newer outputs stay whole, the report keeps most
    # of its lines.
    assert kept(ledger.tokens - 1) >= 30
    # Room, but less than the newest routine output would take back whole: the report's
    # placeholder keeps more of its lines.
    some = kept(plan(1).tokens_after + 500)
    assert tight < some


# --- runs that follow runs ----------------------------------------------------------------------

FAILURE = (
    "E       AssertionError: assert 4120 == 4096\n"
    "FAILED tests/test_ledger.py::test_refund_rebalances_batch - AssertionError: assert 4120 == 4096"
)


def test_it_keeps_the_main_failure_through_twelve_compactions() -> None:
    """The session's main failure is in the first run's summary; every later run merges new
    work into it, including reruns where the same failure repeats until it looks routine. A
    newer, weaker line never evicts it."""
    rng = random.Random(3)
    ledger = Ledger()
    ledger.add("SYSTEM_PROMPT", "You are a coding agent.")
    ledger.add("USER_MESSAGE", "The refund test fails; find out why.")
    ledger.tool("pytest", f"$ pytest -q\n{'.' * 40}F\n{FAILURE}\n1 failed, 40 passed in 2.10s")
    limit, runs = 2_400, 0
    for turn in range(51):
        ledger.tool(
            f"grep-{turn}",
            "\n".join(
                f"src/ledger/mod_{rng.randrange(40)}.py:{rng.randrange(400)}: total = compute(batch)"
                for _ in range(rng.randrange(8, 20))
            ),
        )
        if turn % 6 == 0:
            # The agent reruns a narrower test: the failure's template, other numbers.
            ledger.tool(
                f"pytest-{turn}",
                f"E       AssertionError: assert {rng.randrange(10**4)} == {rng.randrange(10**4)}\n1 failed in 0.{turn}s",
            )
        ledger.add("AGENT_MESSAGE", f"Step {turn}: looked at the output; continuing.")
        if ledger.tokens >= 0.8 * limit:
            ledger.compact(
                Budget(
                    context_limit=limit,
                    target_tokens=int(0.8 * limit),
                    max_summary_tokens=256,
                    room_target_tokens=limit // 2,
                )
            )
            runs += 1
            assert "4120 == 4096" in ledger.text(), (runs, ledger.summary)
            assert "test_refund_rebalances_batch" in ledger.text(), (runs, ledger.summary)
    assert runs >= 12


def test_it_counts_names_numbered_in_a_series_once() -> None:
    listing = "\n".join(f"def helper_{k}(x):\n    return x + {k}" for k in range(1, 60))
    report = loss_report(
        folded=[(3, listing), (4, "FAILED tests/test_a.py::test_b")], active=["helper_7"]
    )
    assert report["evidenceBefore"] < 10
    assert not any(item["text"].startswith("helper_") for item in report["dropped"])


def test_it_writes_no_heading_without_an_item() -> None:
    messages = [
        SummaryMessage(
            event_id="e4",
            type="AGENT_MESSAGE",
            role="assistant",
            content="a.py and b.py define the ledger totals used by the refund path.",
            seq=4,
        )
    ]
    for budget in (8, 12, 16):
        summary = LocalSummarizer(count_tokens=COUNTER.count).summarize(
            previous_summary="", messages=messages, max_tokens=budget
        )
        assert "[#4]" in summary
        assert not summary.startswith("#")


def test_it_never_lets_a_weaker_new_line_evict_a_stronger_old_one() -> None:
    """The previous summary's failure line is ranked as it was when it was news: a new batch
    that repeats its template (the test rerun with other numbers) until it looks routine, and
    brings weaker one-off lines of its own, does not push it out."""
    previous = (
        "## Issues and solutions\n"
        "- bash output: FAILED tests/test_ledger.py::test_refund_rebalances_batch - "
        "AssertionError: assert 4120 == 4096 [#3]\n"
    )
    rng = random.Random(8)
    messages = []
    for k in range(40):
        rerun = "\n".join(
            f"FAILED tests/test_ledger.py::test_case_{k}_{j} - AssertionError: "
            f"assert {rng.randrange(10**4)} == {rng.randrange(10**4)}"
            for j in range(6)
        )
        messages.append(
            SummaryMessage(
                event_id=f"e{k}",
                type="TOOL_RESULT",
                role="tool",
                name="bash",
                content=f"{rerun}\nnode-{k} ready in {rng.randrange(100, 999)} ms",
                seq=10 + k,
            )
        )
    summary = LocalSummarizer(count_tokens=COUNTER.count).summarize(
        previous_summary=previous, messages=messages, max_tokens=160
    )
    assert "test_refund_rebalances_batch" in summary, summary
