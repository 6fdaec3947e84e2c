"""The offline extractive summarizer and the shared token-bounded truncation helper."""

from __future__ import annotations

import random
import re

import pytest

from compaction_app.summarizers import local as local_summarizer
from compaction_app.summarizers.base import SummaryMessage, summarizer_class
from compaction_app.summarizers.local import SECTIONS, LocalSummarizer
from compaction_app.testkit.session_gen import generate_session
from sessions_app.tokens import truncate_to_tokens

pytestmark = pytest.mark.profile_independent


def words(text: str) -> int:
    return len(text.split())


def real_counter():
    """o200k when its vocabulary loads offline, else the word counter."""
    try:
        from sessions_app.tokens import get_counter
    except ImportError:
        return words
    counter = get_counter("o200k_base")
    return counter.count if counter.exact else words


ROLES = {
    "SYSTEM_PROMPT": "system",
    "USER_MESSAGE": "user",
    "AGENT_MESSAGE": "assistant",
    "TOOL_CALL": "assistant",
    "TOOL_RESULT": "tool",
}


def msg(n: int, type_: str, content: str, name: str = "") -> SummaryMessage:
    return SummaryMessage(
        event_id=f"e{n}", type=type_, role=ROLES[type_], content=content, name=name
    )


FILLER = [
    "Sure, let me take a look at that.",
    "Okay, sounds good.",
    "Thanks, that makes sense to me.",
    "Let me think about it for a moment.",
    "Great, I will continue now.",
]


def planted_conversation(filler_rounds: int = 40) -> list[SummaryMessage]:
    messages = [
        msg(
            1,
            "USER_MESSAGE",
            "Please speed up the nightly export job. Never use port 8080 for the debug server.",
        ),
        msg(2, "AGENT_MESSAGE", "Sure, let me take a look at that."),
        msg(3, "TOOL_CALL", '{"command": "python -m exports.nightly"}', "bash"),
        msg(
            4,
            "TOOL_RESULT",
            "starting export\n" * 50
            + 'Traceback (most recent call last):\n  File "exports/nightly.py", line 88\n'
            + "KeyError: 'tenant_id_7'\n",
            "bash",
        ),
        msg(
            5,
            "AGENT_MESSAGE",
            "The crash comes from src/exports/nightly_job.py where the tenant map is built.",
        ),
        msg(6, "USER_MESSAGE", "Note that the upstream rate limit is 7431 requests per minute."),
    ]
    n = 7
    for round_ in range(filler_rounds):
        messages.append(msg(n, "USER_MESSAGE", FILLER[round_ % 5]))
        messages.append(
            msg(n + 1, "AGENT_MESSAGE", FILLER[(round_ + 2) % 5] + " " + FILLER[(round_ + 3) % 5])
        )
        n += 2
    return messages


def headings(summary: str) -> list[str]:
    return [line[3:] for line in summary.splitlines() if line.startswith("## ")]


def test_it_is_registered_as_local() -> None:
    assert summarizer_class("local") is LocalSummarizer


def in_order(found: list[str]) -> bool:
    return found == [name for name in SECTIONS if name in found]


def test_it_writes_the_non_empty_sections_in_order_and_drops_empty_ones() -> None:
    summarizer = LocalSummarizer(count_tokens=words)
    summary = summarizer.summarize(
        previous_summary="", messages=planted_conversation(), max_tokens=300
    )
    assert in_order(headings(summary))
    assert "Changes made" not in headings(summary)  # nothing was changed
    assert "None." not in summary
    for heading in headings(summary):
        body = summary.split(f"## {heading}\n", 1)[1]
        assert body.startswith("- ")


def test_it_is_deterministic() -> None:
    messages = planted_conversation()
    first = LocalSummarizer(count_tokens=words).summarize(
        previous_summary="", messages=messages, max_tokens=120
    )
    second = LocalSummarizer(count_tokens=words).summarize(
        previous_summary="", messages=messages, max_tokens=120
    )
    assert first == second


@pytest.mark.parametrize("counter", [words, real_counter()], ids=["words", "tokenizer"])
def test_it_keeps_planted_facts_over_filler(counter) -> None:
    summary = LocalSummarizer(count_tokens=counter).summarize(
        previous_summary="", messages=planted_conversation(), max_tokens=200
    )
    assert counter(summary) <= 200
    for fact in (
        "Never use port 8080",
        "KeyError: 'tenant_id_7'",
        "src/exports/nightly_job.py",
        "7431 requests per minute",
        "speed up the nightly export job",
    ):
        assert fact in summary, fact
    for filler in FILLER:
        assert filler not in summary


@pytest.mark.parametrize("max_tokens", [1, 12, 40, 90, 256, 1500])
@pytest.mark.parametrize("counter", [words, real_counter()], ids=["words", "tokenizer"])
def test_it_holds_the_summary_to_max_tokens(counter, max_tokens: int) -> None:
    session = generate_session(turns=30, seed=3, target_tokens=60_000)
    messages = [
        msg(i, e["type"], e["content"], e.get("name", "")) for i, e in enumerate(session.events)
    ]
    summary = LocalSummarizer(count_tokens=counter).summarize(
        previous_summary="", messages=messages, max_tokens=max_tokens
    )
    assert counter(summary) <= max_tokens
    if max_tokens >= 256:
        assert in_order(headings(summary)) and len(headings(summary)) >= 4
        assert summary.count("\n- ") >= 5


def test_it_drops_whole_items_rather_than_cutting_words() -> None:
    summarizer = LocalSummarizer(count_tokens=words)
    messages = planted_conversation()
    long_summary = summarizer.summarize(previous_summary="", messages=messages, max_tokens=2000)
    short_summary = summarizer.summarize(previous_summary="", messages=messages, max_tokens=60)
    long_items = {line for line in long_summary.splitlines() if line.startswith("- ")}
    for line in short_summary.splitlines():
        if line.startswith("- "):
            assert line in long_items


def test_it_merges_the_previous_summary_incrementally() -> None:
    summarizer = LocalSummarizer(count_tokens=words)
    first = summarizer.summarize(
        previous_summary="", messages=planted_conversation(5), max_tokens=400
    )
    later = [
        msg(
            100,
            "USER_MESSAGE",
            "Now add a retry to the webhook sender; always use exponential backoff.",
        ),
        msg(
            101,
            "AGENT_MESSAGE",
            "We decided to use tenacity instead of a hand-written loop in src/webhooks/sender.py.",
        ),
        msg(102, "TOOL_CALL", '{"path": "src/webhooks/sender.py"}', "read_file"),
        msg(103, "TOOL_RESULT", "def send(payload):\n    return post(payload)\n", "read_file"),
    ]
    second = summarizer.summarize(previous_summary=first, messages=later, max_tokens=400)
    assert in_order(headings(second))
    # Old facts survive, new ones join, nothing is repeated.
    for fact in ("Never use port 8080", "KeyError: 'tenant_id_7'", "7431 requests per minute"):
        assert fact in second
    assert "always use exponential backoff" in second
    assert "tenacity instead of a hand-written loop" in second
    assert "src/webhooks/sender.py" in second
    items = [line for line in second.splitlines() if line.startswith("- ")]
    assert len(items) == len(set(items))
    # Status describes the latest state: the folded-message tally accumulates.
    total = len(planted_conversation(5)) + len(later)
    assert f"Folded so far: {total} messages" in second
    assert second.count("Folded so far") == 1


def test_it_merges_a_previous_summary_written_by_another_summarizer() -> None:
    previous = "## Key technical context\n- The cache key is TenantCacheKey99.\n\nSome free text about 8443."
    summary = LocalSummarizer(count_tokens=words).summarize(
        previous_summary=previous, messages=[msg(1, "USER_MESSAGE", "Continue.")], max_tokens=300
    )
    assert "TenantCacheKey99" in summary
    assert "8443" in summary


def test_it_summarizes_huge_input_in_one_pass() -> None:
    """The local summarizer has no model window: it reads everything folded at once (pieces
    would each re-rank a running summary that, with the room as its budget, can be most of the
    session), whatever `input_window_tokens` says."""
    facts_first = msg(0, "USER_MESSAGE", "Never deploy on Fridays; the freeze window is 48 hours.")
    bulk = [
        msg(i, "TOOL_RESULT", " ".join(f"line{i}_{k} ok." for k in range(400)), "bash")
        for i in range(1, 200)
    ]
    facts_last = msg(
        999, "AGENT_MESSAGE", "We decided to use QuorumLockManager7 instead of file locks."
    )
    messages = [facts_first, *bulk, facts_last]
    summarizer = LocalSummarizer(count_tokens=words, input_window_tokens=5_000)
    assert len(summarizer._pieces(messages, reserve=300)) == 1
    summary = summarizer.summarize(previous_summary="", messages=messages, max_tokens=300)
    assert words(summary) <= 300
    assert "freeze window is 48 hours" in summary
    assert "QuorumLockManager7" in summary
    tally = re.search(
        r"Folded so far: (\d+) messages \((\d+) user, (\d+) assistant, (\d+) tool", summary
    )
    assert tally is not None
    assert int(tally.group(1)) == len(messages)
    assert sum(int(tally.group(k)) for k in (2, 3, 4)) == len(messages)


def test_it_summarizes_a_million_token_session() -> None:
    # Its speed is measured in bench/bench_compaction.py; this checks the result.
    counter = real_counter()
    session = generate_session()
    messages = [
        msg(i, e["type"], e["content"], e.get("name", "")) for i, e in enumerate(session.events[1:])
    ]
    summarizer = LocalSummarizer(count_tokens=counter)
    summary = summarizer.summarize(previous_summary="", messages=messages, max_tokens=2000)
    assert counter(summary) <= 2000
    kept = [fact for fact in session.facts if fact in summary]
    assert len(kept) >= len(session.facts) // 3


def boilerplate_conversation() -> tuple[list[SummaryMessage], list[str]]:
    """An agent repeating one sentence template with a new path each turn, plus a few one-off
    identifier facts phrased as changes (the lowest-priority section)."""
    modules = ["billing", "ledger", "exports", "auth", "search", "webhooks"]
    words_ = ["tenant", "cursor", "budget", "shard", "quota", "window", "policy"]
    facts = [
        f"{name}Resolver{1000 + 37 * k}"
        for k, name in enumerate(["Quota", "Shard", "Cursor", "Ledger", "Window"])
    ]
    messages: list[SummaryMessage] = [
        msg(0, "USER_MESSAGE", "Please make the quota lookups consistent across the services.")
    ]
    for turn in range(60):
        text = (
            f"I updated the two in src/{modules[turn % 6]}/{words_[turn % 7]}_views_{turn}.py; "
            f"the others already pass the {words_[(turn * 3) % 7]} explicitly."
        )
        if turn % 12 == 5:
            fact = facts[turn // 12]
            text += (
                f" The lookup goes through {fact} in the {modules[turn // 12]} package, "
                "so I changed it there."
            )
        messages.append(msg(turn + 1, "AGENT_MESSAGE", text))
    return messages, facts


BOILERPLATE = re.compile(r"^- I updated the two in .*explicitly\.$", re.MULTILINE)


@pytest.mark.parametrize("counter", [words, real_counter()], ids=["words", "tokenizer"])
def test_it_keeps_one_off_identifiers_over_a_repeated_sentence_template(counter) -> None:
    messages, facts = boilerplate_conversation()
    # Room for roughly a dozen bullets, far fewer than the 65 candidate sentences.
    budget = 260 if counter is words else 420
    summary = LocalSummarizer(count_tokens=counter).summarize(
        previous_summary="", messages=messages, max_tokens=budget
    )
    assert counter(summary) <= budget
    for fact in facts:
        assert fact in summary, fact


DISTINCT_NOTES = [
    "The nightly export reads tenants in pages of `export_page_size` = 500 rows.",
    "Billing totals go through `round_half_even` before the invoice is rendered.",
    "Staging runs Postgres 15 behind `pgbouncer` while production is still on 14.",
    "Webhook retries back off from 2 to 64 seconds in `webhook_backoff`.",
    "The `audit_log` table is partitioned by month, so old rows are cheap to drop.",
    "Search reindexing by `reindex_all` takes about 40 minutes on the full corpus.",
    "Feature flags come from `flag_cache` once per request, not per query.",
    "Corrections to `ledger_entry` rows are appended as reversals, never updated in place.",
]


def test_it_deduplicates_a_repeated_sentence_template() -> None:
    messages, facts = boilerplate_conversation()
    # One-off notes of many shapes, each scoring below the template's raw score.
    for k, note in enumerate(DISTINCT_NOTES):
        messages.insert(1 + 7 * k, msg(200 + k, "AGENT_MESSAGE", note))
    summarizer = LocalSummarizer(count_tokens=words)
    tight = summarizer.summarize(previous_summary="", messages=messages, max_tokens=280)
    roomy = summarizer.summarize(previous_summary="", messages=messages, max_tokens=5000)
    # Under pressure the template keeps a few instances, not the bulk of the budget (ranking
    # by raw score alone gave it 8 of the ~20 bullets)...
    assert 1 <= len(BOILERPLATE.findall(tight)) <= 4
    assert sum(note in tight for note in DISTINCT_NOTES) >= 6
    # ... while nothing is lost when everything fits.
    assert len(BOILERPLATE.findall(roomy)) == 60
    assert all(fact in roomy for fact in facts)
    assert all(note in roomy for note in DISTINCT_NOTES)


def test_it_ranks_thousands_of_near_identical_sentences() -> None:
    # Same template, a different plain word each time: every shape is distinct but similar to
    # all the others, the worst case of the shape-similarity join. Must stay linear.
    vocab = [f"{a}{b}{c}" for a in "bcdfg" for b in "aeiou" for c in "klmnprst"]
    messages = [
        msg(
            i,
            "AGENT_MESSAGE",
            f"Done: the worker now batches the {vocab[i % len(vocab)]} queries "
            f"(one query per {vocab[(i * 7) % len(vocab)]} instead of one per row).",
        )
        for i in range(3000)
    ]
    messages.append(msg(3000, "AGENT_MESSAGE", "The lookup goes through FooResolver42 now."))
    summary = LocalSummarizer(count_tokens=words).summarize(
        previous_summary="", messages=messages, max_tokens=300
    )
    assert words(summary) <= 300
    assert "FooResolver42" in summary


# --- truncate_to_tokens ------------------------------------------------------------------------

TEXT = (
    "The export crashed at 02:00. We traced it to the tenant map! Is the cache warm? "
    "It was not.\nNext we add a retry with backoff and a metric for each attempt"
)


def test_it_returns_text_that_already_fits_unchanged() -> None:
    assert truncate_to_tokens(TEXT, max_tokens=1000, count_tokens=words) == TEXT


@pytest.mark.parametrize("max_tokens", range(4, 40))
def test_it_truncates_at_a_sentence_end_within_budget(max_tokens: int) -> None:
    cut = truncate_to_tokens(TEXT, max_tokens=max_tokens, count_tokens=words)
    assert words(cut) <= max_tokens
    assert TEXT.startswith(cut)
    # Never mid-word: the cut is followed by whitespace (or is the whole text).
    assert cut == TEXT or TEXT[len(cut)].isspace()


def test_it_prefers_the_last_sentence_that_fits() -> None:
    assert truncate_to_tokens(TEXT, max_tokens=12, count_tokens=words) == (
        "The export crashed at 02:00. We traced it to the tenant map!"
    )


def test_it_falls_back_to_a_word_boundary_for_one_long_sentence() -> None:
    sentence = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu."
    assert (
        truncate_to_tokens(sentence, max_tokens=5, count_tokens=words)
        == "alpha beta gamma delta epsilon"
    )


def test_it_returns_nothing_when_no_word_fits() -> None:
    assert truncate_to_tokens("supercalifragilistic", max_tokens=0, count_tokens=words) == ""
    assert truncate_to_tokens("a" * 50, max_tokens=1, count_tokens=lambda s: len(s)) == ""


def test_it_truncates_huge_text_with_a_real_tokenizer() -> None:
    counter = real_counter()
    text = " ".join(f"Sentence {i} mentions FooBar{i} and src/mod_{i}.py." for i in range(200_000))
    cut = truncate_to_tokens(text, max_tokens=500, count_tokens=counter)
    assert 450 <= counter(cut) <= 500
    assert cut.endswith(".py.")


# --- evidence, citations, novelty, corrections (issue 11) --------------------------------------


def seq_msg(seq: int, type_: str, content: str, name: str = "") -> SummaryMessage:
    return SummaryMessage(
        event_id=f"e{seq}", type=type_, role=ROLES[type_], content=content, name=name, seq=seq
    )


CITED = re.compile(r" \[#(\d+)(?:-#(\d+))?\]$")


def shell_session() -> list[SummaryMessage]:
    messages = [
        seq_msg(100, "USER_MESSAGE", "Import the orders CSV into the staging database."),
        seq_msg(
            101, "TOOL_CALL", '{"command": "python manage.py import_orders orders.csv"}', "bash"
        ),
    ]
    rows = "\n".join(f"ValueError: bad row {n}: missing currency" for n in range(40))
    messages.append(seq_msg(102, "TOOL_RESULT", f"importing\n{rows}\nexit status 2", "bash"))
    for k in range(40):
        messages.append(
            seq_msg(
                120 + k,
                "TOOL_RESULT",
                f"retry {k}\nValueError: bad row {900 + k}: missing currency",
                "bash",
            )
        )
    messages += [
        seq_msg(
            170,
            "AGENT_MESSAGE",
            "Set WORKER_CONCURRENCY=8 in deploy/worker.env so the import runs in parallel.",
        ),
        seq_msg(171, "TOOL_RESULT", "$ git rev-parse HEAD\n4be1f07c9a1e\n", "bash"),
        seq_msg(
            180,
            "AGENT_MESSAGE",
            "Correction: WORKER_CONCURRENCY=4, not 8; the staging nodes only have 4 cores.",
        ),
    ]
    return messages


def test_it_ends_every_summary_line_with_the_seqs_it_came_from() -> None:
    summary = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=shell_session(), max_tokens=600
    )
    bullets = [line for line in summary.splitlines() if line.startswith("- ")]
    assert bullets
    for line in bullets:
        match = CITED.search(line)
        assert match, line
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        assert 100 <= first <= last <= 180


def test_it_collapses_a_repeated_pattern_into_one_line_with_a_count_and_seq_range() -> None:
    summary = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=shell_session(), max_tokens=600
    )
    lines = [line for line in summary.splitlines() if "ValueError: bad row" in line]
    assert len(lines) == 1
    assert re.search(r"… ×80 \[#102-#159\]$", lines[0]), lines[0]


def test_it_keeps_the_newest_statement_when_a_later_message_corrects_it() -> None:
    summary = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=shell_session(), max_tokens=600
    )
    assert "WORKER_CONCURRENCY=4" in summary
    assert "WORKER_CONCURRENCY=8" not in summary


def test_it_keeps_the_evidence_of_tool_output() -> None:
    summary = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=shell_session(), max_tokens=600
    )
    # The failure and the command's failing outcome: the output's verdict.
    assert "ValueError: bad row" in summary
    assert "exit status 2" in summary
    # A value nobody asked for or named (HEAD's hash, printed once) only fills room the
    # verdicts leave: at a budget that holds little, the verdicts stay and it goes.
    small = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=shell_session(), max_tokens=200
    )
    assert "exit status 2" in small
    assert "ValueError: bad row" in small
    assert "4be1f07c9a1e" not in small


def test_it_does_not_repeat_what_the_kept_events_say() -> None:
    messages = shell_session()
    summarizer = LocalSummarizer(count_tokens=real_counter())
    alone = summarizer.summarize(previous_summary="", messages=messages, max_tokens=600)
    assert "Import the orders CSV" in alone
    kept = "Import the orders CSV into the staging database. HEAD is 4be1f07c9a1e."
    novel = summarizer.summarize(
        previous_summary="", messages=messages, max_tokens=600, kept_text=kept
    )
    assert "Import the orders CSV" not in novel
    assert "4be1f07c9a1e" not in novel
    assert "WORKER_CONCURRENCY=4" in novel


def test_it_fills_its_budget_when_there_is_evidence_to_keep() -> None:
    counter = real_counter()
    session = generate_session(turns=120, seed=5, target_tokens=200_000)
    messages = [
        seq_msg(i + 1, e["type"], e["content"], e.get("name", ""))
        for i, e in enumerate(session.events)
    ]
    summary = LocalSummarizer(count_tokens=counter).summarize(
        previous_summary="", messages=messages, max_tokens=2000
    )
    assert 0.85 * 2000 <= counter(summary) <= 2000


def test_it_carries_the_previous_summary_citations_forward() -> None:
    summarizer = LocalSummarizer(count_tokens=words)
    first = summarizer.summarize(previous_summary="", messages=shell_session()[:3], max_tokens=400)
    later = [seq_msg(300, "USER_MESSAGE", "Never deploy on Fridays; the freeze is 48 hours.")]
    second = summarizer.summarize(previous_summary=first, messages=later, max_tokens=400)
    assert "Never deploy on Fridays; the freeze is 48 hours. [#300]" in second
    assert any(
        "ValueError: bad row" in line and line.endswith("[#102]") for line in second.splitlines()
    ), second


def test_it_drops_a_folded_value_the_kept_events_have_corrected() -> None:
    messages = shell_session()[:-1]  # the agent's correction is not among the folded ones
    kept = "Correction: WORKER_CONCURRENCY=4, not 8. The staging nodes only have 4 cores."
    summary = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=messages, max_tokens=600, kept_text=kept
    )
    assert "WORKER_CONCURRENCY=8" not in summary
    alone = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=messages, max_tokens=600
    )
    assert "WORKER_CONCURRENCY=8" in alone


class RecordingSummarizer(LocalSummarizer):
    """Keeps each ranked pool the summarizer fills its budget from, to check the fill."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pools: list[tuple[list, int]] = []

    def _fill(self, pool, *, max_tokens: int) -> str:
        self.pools.append((list(pool), max_tokens))
        return super()._fill(pool, max_tokens=max_tokens)


def fill_by_counting_every_prefix(summarizer: LocalSummarizer, pool: list, max_tokens: int) -> str:
    """The budget fill done the slow, obvious way: render and count each longer prefix."""

    def fits(items: list) -> bool:
        return summarizer.count_tokens(summarizer._render(items)) <= max_tokens

    size = 0
    while size < len(pool) and fits(pool[: size + 1]):
        size += 1
    chosen = pool[:size]
    if not chosen and pool:
        return truncate_to_tokens(
            summarizer._render(pool[:1]),
            max_tokens=max_tokens,
            count_tokens=summarizer.count_tokens,
        )
    for item in pool[size + 1 : size + 1 + local_summarizer._TOP_UP_TRIES]:
        if fits([*chosen, item]):
            chosen.append(item)
    return summarizer._render(chosen)


def session_messages() -> list[SummaryMessage]:
    session = generate_session(turns=120, seed=5, target_tokens=200_000)
    return [
        seq_msg(i + 1, e["type"], e["content"], e.get("name", ""))
        for i, e in enumerate(session.events)
    ]


@pytest.mark.parametrize("max_tokens", [256, 2000])
def test_it_fills_the_budget_as_counting_every_prefix_would(max_tokens: int) -> None:
    summarizer = RecordingSummarizer(count_tokens=real_counter())
    summary = summarizer.summarize(
        previous_summary="", messages=session_messages(), max_tokens=max_tokens
    )
    pools = list(summarizer.pools)
    assert len(pools) == 1  # one pass: the local summarizer has no model window
    for pool, budget in pools:
        expected = fill_by_counting_every_prefix(summarizer, pool, budget)
        assert LocalSummarizer._fill(summarizer, pool, max_tokens=budget) == expected
    assert summary == fill_by_counting_every_prefix(summarizer, *pools[-1])


def test_it_counts_each_item_about_once_when_filling_the_budget() -> None:
    counter = real_counter()
    counted: list[int] = []

    def counting(text: str) -> int:
        counted.append(len(text))
        return counter(text)

    summarizer = RecordingSummarizer(count_tokens=counter)
    summarizer.summarize(previous_summary="", messages=session_messages(), max_tokens=2000)
    pool, budget = summarizer.pools[-1]
    summarizer.count_tokens = counting
    summary = LocalSummarizer._fill(summarizer, pool, max_tokens=budget)
    # Counting the whole pool, a prefix per bisection step and each top-up try read 20-27 times
    # the summary's length; per-line counts leave the edge of the prefix and the top-ups the
    # estimate cannot rule out.
    assert sum(counted) <= 12 * len(summary), (sum(counted), len(summary))


def test_it_finds_every_error_line_its_pattern_matches() -> None:
    output = "\n".join(
        [
            "collected 12 items",
            "tests/test_orders.py::test_import FAILED",
            "E       ValueError: bad row 17",
            "Traceback (most recent call last):",
            '  File "/srv/app/loader.py", line 40, in load',
            "psycopg.errors.UniqueViolation: duplicate key value",  # no Error/Exception name
            "=========== 2 failed, 10 passed in 1.23s ===========",
            "error: pathspec 'main2' did not match any file(s) known to git",
            "fatal: not a git repository (or any of the parent directories): .git",
            "panic: runtime error: index out of range [3] with length 3",
            "Error: unknown flag --frobnicate",  # no word before Error: not matched
            "this line mentions ValueError but has no message",
            "3 failedover is not a tally",
            "everything fine",
        ]
    )
    expected = [line for line in output.splitlines() if local_summarizer._TOOL_ERROR.search(line)]
    found = list(
        local_summarizer._lines_matching(
            output, local_summarizer._TOOL_ERROR_NEEDLES, local_summarizer._TOOL_ERROR
        )
    )
    assert found == expected
    assert len(found) == 7


# --- salience and decisions (issue 24) ---------------------------------------------------------


def test_it_takes_its_path_and_url_patterns_from_the_evidence_extractor() -> None:
    from compaction_app import evidence

    assert local_summarizer._PATH is evidence.FILE_PATH
    assert not hasattr(local_summarizer, "_URL")


def routine_results(start: int, count: int) -> list[SummaryMessage]:
    messages = []
    for k in range(count):
        messages.append(
            seq_msg(
                start + k,
                "TOOL_RESULT",
                f"$ pytest tests/unit -q\n{'.' * (40 + k % 30)} [100%]\n{40 + k % 30} passed in "
                f"{1 + k % 7}.{k % 10}2s\nwrote coverage to htmlcov/index_{k}.html",
                "bash",
            )
        )
    return messages


DECISIONS = [
    "I chose a retention of 14 days for the audit snapshots.",
    "We rolled back to revision 43 of the checkout release.",
    "We'll keep the rate limit at 120 requests per minute for partners.",
]


@pytest.mark.parametrize("budget", [160, 2000])
def test_it_keeps_decisions_in_prose_ahead_of_routine_tool_lines(budget: int) -> None:
    messages = [seq_msg(1, "USER_MESSAGE", "Stabilise the checkout release.")]
    messages += routine_results(2, 60)
    messages += [seq_msg(100 + k, "AGENT_MESSAGE", text) for k, text in enumerate(DECISIONS)]
    messages += routine_results(200, 60)
    counter = real_counter()
    summary = LocalSummarizer(count_tokens=counter).summarize(
        previous_summary="", messages=messages, max_tokens=budget
    )
    assert counter(summary) <= budget
    for decision in DECISIONS:
        assert decision in summary, summary


def test_it_keeps_every_row_of_one_output_that_names_another_release() -> None:
    history = (
        "$ helm history checkout\n"
        "REVISION\tSTATUS    \tCHART          \tDESCRIPTION\n"
        "43      \tsuperseded\tcheckout-4.18.0\tUpgrade complete\n"
        "44      \tfailed    \tcheckout-4.18.2\tUpgrade failed: timed out waiting for the condition\n"
        "45      \tdeployed  \tcheckout-4.18.0\tRollback to 43\n"
    )
    messages = [seq_msg(1, "USER_MESSAGE", "Why did the release fail?")]
    messages += routine_results(2, 30)
    messages.append(seq_msg(50, "TOOL_RESULT", history, "bash"))
    messages += routine_results(60, 30)
    summary = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=messages, max_tokens=2000
    )
    # Rows of one output do not supersede each other as a later message's value would.
    assert "checkout-4.18.2" in summary
    assert "Rollback to 43" in summary


LONG_FAILURES = {
    "payouts_external_id_key": (
        "psycopg.errors.UniqueViolation: duplicate key value violates unique constraint "
        '"payouts_external_id_key" DETAIL: Key (external_id)=(755630) already exists. CONTEXT: '
        'COPY payouts, line 8123: "755630,2025-11-02,EUR,1200.00,acct_9f2c41"'
    ),
    "ledger_entries_account_fkey": (
        'psycopg.errors.ForeignKeyViolation: insert or update on table "ledger_entries" violates '
        'foreign key constraint "ledger_entries_account_fkey" DETAIL: Key (account_id)='
        '(acct_77d1e0) is not present in table "accounts".'
    ),
}
SHORT_FACTS = {
    "SEARCH_TIMEOUT_MS=1500": (
        "$ git diff deploy/prod.env\n-SEARCH_TIMEOUT_MS=6000\n+SEARCH_TIMEOUT_MS=1500"
    ),
    "search-worker-5a66887c05-f2ad0": (
        "$ kubectl get pods -n shop\n"
        "search-worker-5a66887c05-f2ad0   0/1     CrashLoopBackOff   36         23m"
    ),
    "631311f": (
        "$ git bisect run pytest -q tests/test_payouts.py\n"
        "631311fc1a9c173229af0bb038176cd57671b921 is the first bad commit"
    ),
    "refunds_archive_2024": (
        '$ psql -c "insert into refunds_archive_2024 select 1"\n'
        'ERROR:  relation "refunds_archive_2024" does not exist'
    ),
}


def one_off_failures_session() -> list[SummaryMessage]:
    """Two long failure lines and four short ones, each in its own output among routine runs."""
    outputs = [
        LONG_FAILURES["payouts_external_id_key"],
        SHORT_FACTS["SEARCH_TIMEOUT_MS=1500"],
        LONG_FAILURES["ledger_entries_account_fkey"],
        *list(SHORT_FACTS.values())[1:],
    ]
    messages = [seq_msg(1, "USER_MESSAGE", "Find out why the refunds and payouts jobs fail.")]
    seq = 2
    for output in outputs:
        messages += routine_results(seq, 12)
        messages.append(seq_msg(seq + 12, "TOOL_RESULT", output, "bash"))
        seq += 13
    return messages + routine_results(seq, 12)


def test_it_prefers_short_one_off_facts_to_long_lines_at_a_tiny_budget() -> None:
    counter = real_counter()
    summary = LocalSummarizer(count_tokens=counter).summarize(
        previous_summary="",
        messages=one_off_failures_session(),
        max_tokens=256,
        kept_text="Find out why the refunds and payouts jobs fail.",
    )
    assert counter(summary) <= 256
    # A 90-token line is a third of this budget: three short one-off facts tell more.
    assert [fact for fact in SHORT_FACTS if fact not in summary] == [], summary
    assert sum(fact in summary for fact in LONG_FAILURES) >= 1


def test_it_quotes_a_line_without_the_rules_drawn_around_it() -> None:
    run = (
        "$ pytest tests/test_refunds.py -q\n"
        "....F\n"
        "FAILED tests/test_refunds.py::test_refund_rounding - AssertionError\n"
        "===================== 1 failed, 4 passed in 0.31s ====================="
    )
    messages = [seq_msg(1, "USER_MESSAGE", "Run the refunds tests.")]
    messages += [*routine_results(2, 20), seq_msg(30, "TOOL_RESULT", run, "bash")]
    summary = LocalSummarizer(count_tokens=real_counter()).summarize(
        previous_summary="", messages=messages, max_tokens=2000
    )
    assert "bash output: 1 failed, 4 passed in 0.31s [#30]" in summary
    assert "==" not in summary


_ROLES = {"USER_MESSAGE": "user", "TOOL_RESULT": "tool"}


def test_it_does_not_pad_its_budget_with_lines_nobody_pointed_at() -> None:
    # One request, then routine output full of one-off ids and timestamps that nobody asks
    # about, names or reacts to, and nothing fails: a large budget is not filled with them. A
    # summary is as long as what it has to say.
    counter = real_counter()
    messages = [seq_msg(1, "USER_MESSAGE", "Keep an eye on the checkout service today.")]
    rng = random.Random(8)
    for seq in range(2, 62):
        lines = [
            f"2026-11-20T10:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z INFO "
            f"request_id=req_{rng.getrandbits(48):012x} path=/api/cart status=200 "
            f"duration_ms={rng.randrange(5, 90)}"
            for _ in range(20)
        ]
        messages.append(seq_msg(seq, "TOOL_RESULT", "\n".join(lines), "bash"))
    summary = LocalSummarizer(count_tokens=counter).summarize(
        previous_summary="", messages=messages, max_tokens=4_000
    )
    assert counter(summary) <= 300
    assert "output:" not in summary
