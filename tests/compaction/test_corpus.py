"""The hand-written tool-output corpus and its two halves: every output loads with its facts,
each fact is a literal of its output, and the `tune`/`sealed` split written in `SPLIT` is the
one the fixed rule gives, disjoint, covering every output, and mixing each family."""

from __future__ import annotations

from collections import defaultdict

import pytest

from compaction_app.testkit.tool_output_session import (
    CORPUS,
    SPLITS,
    anthropic_request,
    anthropic_text,
    buried_session,
    facts_kept,
    load_corpus,
    read_split,
    split_rule,
)

pytestmark = pytest.mark.profile_independent


def test_it_loads_every_output_with_facts_found_verbatim_in_it() -> None:
    corpus = load_corpus()
    assert len(corpus) >= 80
    assert sorted(f.name for f in corpus) == sorted(p.stem for p in CORPUS.glob("*.txt"))
    for fixture in corpus:
        assert fixture.facts, fixture.name
        assert facts_kept(fixture.text, fixture.facts) == list(fixture.facts), fixture.name


def test_it_writes_the_split_the_fixed_rule_gives() -> None:
    names = [f.name for f in load_corpus()]
    written = read_split()
    assert written == split_rule(names)
    # The rule depends on the names alone, not on their order or on when it runs.
    assert split_rule(list(reversed(names))) == written
    assert set(written.values()) == set(SPLITS)


def test_it_splits_the_corpus_into_two_disjoint_halves_that_cover_it() -> None:
    tune = {f.name for f in load_corpus(split="tune")}
    sealed = {f.name for f in load_corpus(split="sealed")}
    assert tune and sealed
    assert not tune & sealed
    assert tune | sealed == {f.name for f in load_corpus()}
    assert abs(len(tune) - len(sealed)) <= 0.1 * (len(tune) + len(sealed))


def test_it_puts_every_family_of_two_or_more_outputs_in_both_halves() -> None:
    halves: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    written = read_split()
    for fixture in load_corpus():
        halves[fixture.family].add(written[fixture.name])
        counts[fixture.family] += 1
    assert all(halves[family] == set(SPLITS) for family, n in counts.items() if n >= 2)


def test_it_refuses_an_unknown_split() -> None:
    with pytest.raises(ValueError, match="split"):
        load_corpus(split="held-out")


def test_it_writes_a_buried_session_as_claude_code_sends_it_on_messages() -> None:
    fixture = next(f for f in load_corpus() if f.name == "kubectl_get_json")
    system, messages = anthropic_request(buried_session(fixture, routine=20))
    # Roles alternate, starting with the user; every tool_use is answered by its tool_result.
    roles = [m["role"] for m in messages]
    assert roles[0] == "user"
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))
    uses = [b["id"] for m in messages for b in m["content"] if b["type"] == "tool_use"]
    results = [
        b["tool_use_id"] for m in messages for b in m["content"] if b["type"] == "tool_result"
    ]
    assert uses == results
    # Breakpoints as Claude Code places them: each system block and the last user message.
    marked = [b for b in system if "cache_control" in b]
    marked += [b for m in messages for b in m["content"] if "cache_control" in b]
    last_user = next(m for m in reversed(messages) if m["role"] == "user")
    assert len(marked) == 3 and marked[-1] is last_user["content"][-1]
    text = anthropic_text({"system": system, "messages": messages})
    assert facts_kept(text, fixture.facts) == list(fixture.facts)
