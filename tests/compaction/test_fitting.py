"""Pure unit tests of the fitting core's decision and prune (compaction_app/fitting.py): no
database, no settings."""

from __future__ import annotations

import pytest

from compaction_app.fitting import (
    fit_sequence,
    keep_newest,
    prune,
    prune_turns,
    window_level,
)
from compaction_app.policy import Policy
from sessions_app.context_window import WindowItem, context_cost, required_keys

pytestmark = pytest.mark.profile_independent

POLICY = Policy(compact_threshold=0.8, hard_threshold=0.95, fit_target_ratio=0.5)


def item(key, kind="AGENT_MESSAGE", cost=10, call=""):
    return WindowItem(key=key, type=kind, cost=cost, tool_call_id=call)


@pytest.mark.parametrize(
    ("tokens", "limit", "level"),
    [
        (0, 100, "ok"),
        (79, 100, "ok"),
        (80, 100, "approaching"),
        (94, 100, "approaching"),
        (95, 100, "hard"),
        (500, 100, "hard"),
        (0, 0, "hard"),
    ],
)
def test_it_grades_the_window(tokens, limit, level):
    assert window_level(tokens=tokens, window=limit, policy=POLICY) == level


def test_it_keeps_everything_that_fits():
    items = [item("s", "SYSTEM_PROMPT"), item("u", "USER_MESSAGE"), item("a")]
    assert prune(items, budget=1000) == ["s", "u", "a"]


def test_it_drops_the_oldest_first():
    items = (
        [item("s", "SYSTEM_PROMPT", 10)]
        + [item(f"m{i}", cost=10) for i in range(5)]
        + [item("u", "USER_MESSAGE", 10)]
    )
    # System + user + primer = 23; room for two more 10-token messages within 45.
    assert prune(items, budget=45) == ["s", "m3", "m4", "u"]


def test_it_keeps_a_contiguous_newest_tail():
    items = [
        item("s", "SYSTEM_PROMPT", 5),
        item("small_old", cost=1),
        item("big", cost=50),
        item("new", cost=5),
        item("u", "USER_MESSAGE", 5),
    ]
    # "small_old" would fit by itself, but keeping it across the dropped "big" would leave a hole.
    assert prune(items, budget=30) == ["s", "new", "u"]


def test_it_never_splits_a_tool_call_from_its_result():
    items = [
        item("s", "SYSTEM_PROMPT", 5),
        item("u1", "USER_MESSAGE", 5),
        item("call", "TOOL_CALL", 10, call="c1"),
        item("result", "TOOL_RESULT", 30, call="c1"),
        item("a", cost=5),
        item("u2", "USER_MESSAGE", 5),
    ]
    # Room for the result but not for call + result: both go.
    kept = prune(items, budget=5 + 5 + 5 + 3 + 32)
    assert "call" not in kept and "result" not in kept
    assert kept == ["s", "a", "u2"]
    kept = prune(items, budget=5 + 5 + 5 + 3 + 40)
    assert kept == ["s", "call", "result", "a", "u2"]


def test_it_keeps_parallel_calls_with_their_own_results():
    items = [
        item("u", "USER_MESSAGE", 5),
        item("ca", "TOOL_CALL", 5, call="a"),
        item("cb", "TOOL_CALL", 5, call="b"),
        item("ra", "TOOL_RESULT", 20, call="a"),
        item("rb", "TOOL_RESULT", 5, call="b"),
        item("u2", "USER_MESSAGE", 5),
    ]
    kept = prune(items, budget=5 + 3 + 10 + 5)
    assert kept == ["cb", "rb", "u2"]


def test_it_returns_none_when_the_required_items_do_not_fit():
    items = [item("s", "SYSTEM_PROMPT", 50), item("a", cost=1), item("u", "USER_MESSAGE", 50)]
    assert prune(items, budget=102) is None
    assert prune(items, budget=103) == ["s", "u"]


def test_it_handles_no_user_message_and_no_items():
    assert prune([], budget=10) == []
    items = [item("a1", cost=10), item("a2", cost=10)]
    assert prune(items, budget=13) == ["a2"]
    assert required_keys(items) == []


def test_it_keeps_within_the_budget():
    items = (
        [item("s", "SYSTEM_PROMPT", 7)]
        + [item(f"m{i}", cost=(i * 7) % 13 + 1) for i in range(40)]
        + [item("u", "USER_MESSAGE", 9)]
    )
    costs = {i.key: i.cost for i in items}
    for budget in range(20, 300, 7):
        kept = prune(items, budget=budget)
        assert kept is not None
        assert context_cost([costs[k] for k in kept]) <= budget
        assert kept[0] == "s" and kept[-1] == "u"


class Toy:
    """A `Fittable` of units of known cost: the first must stay, compaction halves the rest."""

    def __init__(self, costs: list[int], *, compacts: bool = True) -> None:
        self.costs = list(costs)
        self.compacts = compacts
        self.runs = 0

    def cost(self) -> int:
        return context_cost(self.costs)

    def compact(self):
        self.runs += 1
        if self.compacts:
            self.costs = [self.costs[0], *(c // 2 for c in self.costs[1:])]
        return None

    def prune(self, budget: int) -> bool:
        if context_cost(self.costs[:1]) > budget:
            return False
        while context_cost(self.costs) > budget:
            del self.costs[1]
        return True

    def refuse(self):
        raise OverflowError("must-keep does not fit")


def test_it_runs_one_sequence_measure_compact_prune_refuse():
    def always(level):
        return level.level != "ok"

    below = Toy([10, 20, 30])
    done = fit_sequence(below, window=100, policy=POLICY, may_compact=always, session_id="s")
    assert (below.runs, done.pruned, done.tokens, done.level.level) == (0, False, 63, "ok")
    # Over the threshold: one compaction, which is enough.
    over = Toy([10, 40, 40])
    done = fit_sequence(over, window=100, policy=POLICY, may_compact=always, session_id="s")
    assert (over.runs, done.pruned, done.tokens) == (1, False, 53)
    # A compaction that does not reach the threshold: the oldest units are pruned to it.
    stuck = Toy([10, 40, 40], compacts=False)
    done = fit_sequence(stuck, window=100, policy=POLICY, may_compact=always, session_id="s")
    assert (stuck.runs, done.pruned, done.tokens) == (1, True, 53)
    # Not allowed to compact: pruned straight away.
    read = Toy([10, 40, 40])
    done = fit_sequence(
        read, window=100, policy=POLICY, may_compact=lambda _: False, session_id="s"
    )
    assert (read.runs, done.pruned) == (0, True)
    # What must stay does not fit the window: refused.
    with pytest.raises(OverflowError):
        fit_sequence(Toy([120, 5]), window=100, policy=POLICY, may_compact=always, session_id="s")


def test_it_compacts_down_to_the_target_never_above_the_threshold():
    assert POLICY.target_ratio == 0.5
    low = Policy(compact_threshold=0.4, hard_threshold=0.95, fit_target_ratio=0.5)
    assert low.target_ratio == 0.4


def test_it_keeps_the_newest_whole_units_next_to_the_required_ones():
    costs = {"s": 5, "a": 10, "b": 10, "c": 10, "u": 5}
    units = [["a"], ["b"], ["c"]]
    # s + u + primer = 13; two 10-token units fit within 33, not three.
    assert keep_newest(units, costs=costs, required=["s", "u"], budget=33) == {"s", "u", "b", "c"}
    assert keep_newest(units, costs=costs, required=["s", "u"], budget=33, extra=1) == {
        "s",
        "u",
        "c",
    }
    assert keep_newest(units, costs=costs, required=["s", "u"], budget=12) is None


def _turns_reference(*, kept, costs, fixed, starts, extra, budget):
    """Dropping the oldest whole turns one cut at a time, as the gateway's thread fitting
    first did: the shared prune must answer the same."""
    body = [i for i in kept if i not in fixed]
    head = [i for i in kept if i in fixed]
    if not body:
        return list(kept)
    for cut in [body[0], *[i for i in body if i in starts and i > body[0]]]:
        remaining = head + [i for i in body if i >= cut]
        if context_cost([costs[i] for i in remaining]) + extra <= budget:
            return remaining
    return None


def test_it_prunes_a_thread_by_whole_turns_keeping_its_system_and_last_turn():
    # 0 system; turns start at 1, 4 and 6.
    costs = {0: 10, 1: 5, 2: 20, 3: 5, 4: 5, 5: 20, 6: 5, 7: 10}
    args = {"costs": costs, "fixed": frozenset({0}), "starts": frozenset({1, 4, 6})}
    kept = list(range(8))
    everything = context_cost(costs.values())
    assert prune_turns(kept=kept, extra=0, budget=everything, **args) == kept
    assert prune_turns(kept=kept, extra=0, budget=everything - 1, **args) == [0, 4, 5, 6, 7]
    assert prune_turns(kept=kept, extra=5, budget=55, **args) == [0, 6, 7]
    assert prune_turns(kept=kept, extra=0, budget=27, **args) is None
    for budget in range(0, everything + 10, 3):
        for extra in (0, 7):
            assert prune_turns(kept=kept, extra=extra, budget=budget, **args) == (
                _turns_reference(kept=kept, extra=extra, budget=budget, **args)
            )
    assert prune_turns(kept=[0], extra=0, budget=1, **args) == [0]
