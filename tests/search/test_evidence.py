"""The evidence extractor, on transcripts written as real tools print them."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_app.evidence import KINDS, extract, extract_many, loss_report, shape_of

pytestmark = pytest.mark.profile_independent

FIXTURES = Path(__file__).parent.parent / "fixtures" / "transcripts"


def keys(name: str) -> set[str]:
    return {item.key for item in extract((FIXTURES / name).read_text(), seq=7)}


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        (
            "pytest.txt",
            {
                "test_tally:2 failed, 98 passed",
                "command:pytest -q tests/test_orders.py",
                "path:tests/test_orders.py",
                "path:shop/orders/archive.py",
                'error:programmingerror: relation "orders_archive_2025" does not exist',
                "error:assertionerror: assert 500 == 422",
                "table:orders_archive_2025",
                "version:pytest==8.3.2",
                "version:python==3.11.9",
                "quantity:12.41s",
            },
        ),
        (
            "git_log.txt",
            {
                "commit:4be1f07",
                "commit:9c2d1aa",
                "migration:0042_orders_archive",
                "ticket:shop-1432",
                "ticket:shop-1450",
                "ticket:#2281",
                "flag:feature_refund_limits",
                "tag:v2.14.0-rc.1",
                "path:shop/orders/migrations/0042_orders_archive.py",
                "command:git show --stat 4be1f07",
            },
        ),
        (
            "git_diff.txt",
            {
                "path:deploy/worker.env",
                "path:config/settings/prod.py",
                "commit:83db48f",
                "commit:bf269f4",
                "setting:worker_concurrency=4",
                "setting:archive_batch_size=5000",
                "setting:statement_timeout_ms=15000",
                "url:redis://cache-1.internal:6379/2",
                "ticket:shop-1388",
            },
        ),
        (
            "psql.txt",
            {
                "url:postgresql://app@db-primary.internal:5432/shop",
                "table:orders_archive_2025",
                "table:order_events",
                "constraint:refunds_order_id_key",
                "constraint:refunds_amount_positive",
                "index:idx_orders_created_at",
                'error:error: duplicate key value violates unique constraint "refunds_order_id_key"',
                "quantity:4312.774ms",
            },
        ),
        (
            "curl.txt",
            {
                "http_status:429",
                "http_status:404",
                "error_code:err_rate_limited",
                "error_code:order_not_found",
                "url:https://api.payments.example.com/v2/refunds",
                "url:http://127.0.0.1:8000/api/orders/991",
            },
        ),
        (
            "kubectl.txt",
            {
                "exit:137",
                "signal:oomkilled",
                "error_code:crashloopbackoff",
                "quantity:512mi",
                "tag:registry.acme.test/shop/worker:2.13.4",
                "command:kubectl get pods -n shop",
            },
        ),
        (
            "traceback.txt",
            {
                "path:/srv/shop/shop/orders/archive.py",
                'error:undefinedtable: relation "orders_archive_2025" does not exist',
                'error:programmingerror: relation "orders_archive_2025" does not exist',
                "signal:killed: 9",
                "exit:1",
                "exit:2",
                "command:make test",
                "command:timeout 60 python -m shop.tools.rebuild_search_index",
            },
        ),
    ],
)
def test_it_extracts_the_evidence_real_tools_print(fixture: str, expected: set[str]) -> None:
    found = keys(fixture)
    assert expected <= found, sorted(expected - found)


def test_it_finds_decisions_plans_causes_todos_and_corrections_in_prose() -> None:
    items = extract((FIXTURES / "prose.txt").read_text(), seq=3)
    kinds = {item.kind for item in items}
    assert {"cause", "decision", "plan", "todo", "correction"} <= kinds
    correction = next(item for item in items if item.kind == "correction")
    assert correction.subject == "setting:worker_concurrency"
    assert {"migration:0041_partition_orders", "quantity:505mib", "ticket:shop-1388"} <= {
        item.key for item in items
    }


def test_it_does_not_mistake_mime_types_branches_or_prose_for_paths_and_tables() -> None:
    found = keys("curl.txt") | keys("git_diff.txt") | keys("prose.txt")
    assert not any(k.startswith("path:application/") for k in found)
    assert "path:origin/fix/archive-table" not in found
    assert "path:HTTP/1.1" not in found
    assert "table:that" not in keys("git_log.txt")


def test_it_ignores_exceptions_that_code_merely_raises() -> None:
    code = "def f(x):\n    if not x:\n        raise ValueError(f'missing {x}')\n"
    assert [item for item in extract(code) if item.kind == "error"] == []


def test_it_gives_every_item_a_kind_text_key_and_seq() -> None:
    for fixture in FIXTURES.glob("*.txt"):
        for item in extract(fixture.read_text(), seq=42):
            assert item.kind in KINDS
            assert item.text and item.key.startswith(item.kind + ":")
            assert item.seq == 42
            assert len(item.text) <= 200


def test_it_reports_a_key_once_at_its_first_seq() -> None:
    items = extract_many([(5, "see src/app/models.py"), (9, "again src/app/models.py")])
    assert [(i.key, i.seq) for i in items] == [("path:src/app/models.py", 5)]


def test_it_gives_repeats_of_one_error_pattern_the_same_shape() -> None:
    assert shape_of("error:valueerror: bad row 17") == shape_of("error:valueerror: bad row 912")
    assert shape_of("error:valueerror: bad row 17") != shape_of("error:keyerror: 'x'")


def test_it_reports_what_a_context_dropped() -> None:
    folded = [
        (10, "$ make test\nmake: *** [Makefile:14: test] Error 2"),
        (11, "The root cause is a missing index on orders.created_at."),
        (12, "HTTP/1.1 429 Too Many Requests\n" + '{"code": "ERR_RATE_LIMITED"}'),
    ]
    report = loss_report(folded=folded, active=["make test failed with exit status 2 [#10]"])
    assert report["evidenceBefore"] == report["evidenceKept"] + report["droppedTotal"]
    dropped = {(d["kind"], d["seq"]) for d in report["dropped"]}
    assert ("http_status", 12) in dropped
    assert ("error_code", 12) in dropped
    assert ("command", 10) not in dropped
    assert ("exit", 10) not in dropped
    assert 0 < report["keptPercent"] < 100
    # What the context cites is one recall away; #12 is cited by nothing.
    assert report["droppedReachable"] == 0


def test_it_says_which_dropped_items_a_citation_reaches() -> None:
    folded = [
        (10, '{"code": "ERR_QUOTA_10"}'),
        (11, '{"code": "ERR_QUOTA_11"}'),
        (14, '{"code": "ERR_QUOTA_14"}'),
        (20, '{"code": "ERR_QUOTA_20"}'),
    ]
    active = [
        "- Deploys were throttled. [#9-#11]",
        "[tool result cleared: bash output [#14], 80 tokens freed]",
    ]
    report = loss_report(folded=folded, active=active)
    assert report["droppedTotal"] == 4
    # #10, #11 by the summary line's range, #14 by its placeholder; #20 by nothing.
    assert report["droppedReachable"] == 3


def test_it_counts_a_collapsed_line_as_holding_every_repeat() -> None:
    folded = [(100 + i, f"ValueError: bad row {i}") for i in range(40)]
    report = loss_report(
        folded=folded, active=["- ValueError: bad row 0 … ×40 [#100-#139]"], max_dropped=5
    )
    assert report["droppedTotal"] == 0
    assert report["keptPercent"] == 100.0
    report = loss_report(folded=folded, active=["nothing here"], max_dropped=5)
    assert report["droppedTotal"] == 40
    assert len(report["dropped"]) == 5


def test_it_extracts_a_megabyte_of_tool_output() -> None:
    # Linear in the input: its speed is measured in bench/bench_compaction.py.
    text = "\n".join(
        f"src/mod_{i}/file_{i}.py:{i}:    return load_tenant(self.cache, tenant_id={i})"
        for i in range(15_000)
    )
    items = extract(text)
    assert sum(item.kind == "path" for item in items) == 15_000


# --- salience (issue 24) ------------------------------------------------------------------------


def routine_log(n: int) -> str:
    return "\n".join(
        f"2026-11-20T10:{k % 60:02d}:{k % 59:02d}.{k:03d}Z INFO request_id=req_{k:06d} "
        f"method=GET path=/api/cart status=200 duration_ms={k % 90}"
        for k in range(n)
    )


def test_it_ranks_a_one_off_line_above_a_template_repeated_hundreds_of_times() -> None:
    from compaction_app.evidence import Salience, template_of

    odd = "2026-11-20T10:31:07.118Z WARN pool exhausted: 64/64 connections in use (db-primary)"
    text = routine_log(300) + "\n" + odd
    salience = Salience([text])
    # Timestamps, ids, numbers and paths are masked: the routine lines share one template.
    assert template_of(text.splitlines()[0]) == template_of(text.splitlines()[1])
    candidates = salience.candidates(text)
    assert candidates[0].line == odd
    assert all(candidates[0].information >= c.information + 4 for c in candidates[1:])
    routine, *_ = salience.information(text.splitlines()[5])
    rare, *_ = salience.information(odd)
    assert rare > routine


def test_it_weighs_a_value_by_its_rarity_in_the_session() -> None:
    from compaction_app.evidence import Salience

    lines = [f"deployed build of checkout-api at revision {n}" for n in range(50)]
    seen_everywhere = "deployed build of shop-web-3.2.0 at revision 7"
    once = "deployed build of shop-web-9f2c41d0a7be at revision 7"
    salience = Salience(["\n".join([*lines, *[seen_everywhere] * 20, once])])
    assert salience.information(once)[0] > salience.information(seen_everywhere)[0]


def test_it_offers_the_outcome_of_a_command_not_its_echo() -> None:
    from compaction_app.evidence import Salience

    ok = "$ make build\ncompiling 12 modules\nbuild ok"
    failed = (
        "$ make deploy RELEASE=r-2026-11-20\nuploading\nerror: quota exceeded for project acme-prod"
    )
    salience = Salience([ok, failed])
    assert not any(c.line.startswith("$ ") for c in salience.candidates(ok))
    lines = [c.line for c in salience.candidates(failed)]
    # The failing command comes just after its failure: its arguments name what failed.
    assert lines[:2] == [
        "error: quota exceeded for project acme-prod",
        "$ make deploy RELEASE=r-2026-11-20",
    ]


def pytest_failures(n: int) -> str:
    return "\n".join(
        f"{'_' * 20} test_refund_rounding {'_' * 20}\n"
        f"E       AssertionError: assert {100 + 7 * k} == {7 + 3 * k}\n"
        f"{'=' * 20} 1 failed, {30 + k} passed in {1 + k % 5}.{k}1s {'=' * 20}"
        for k in range(n)
    )


def test_it_scores_a_quoted_line_as_the_line_it_quotes() -> None:
    from compaction_app.evidence import Salience, quoted_line

    text = pytest_failures(20)
    salience = Salience([text])
    lines = text.splitlines()
    # A summary quotes a line without its margin, pytest's marker or the rules around it...
    assert [quoted_line(line) for line in lines[:3]] == [
        "test_refund_rounding",
        "AssertionError: assert 100 == 7",
        "1 failed, 30 passed in 1.01s",
    ]
    # ...and a later run, re-scoring that quote, still sees a line repeated twenty times.
    for line in lines[:3]:
        assert salience.template_count(quoted_line(line)) == 20
        assert salience.information(quoted_line(line)) == salience.information(line)


def test_it_ranks_the_added_line_of_a_diff_above_the_line_it_replaced() -> None:
    from compaction_app.evidence import Salience, template_of

    listing = "\n".join(f"tests/test_orders_{n}.py" for n in range(80))
    diff = "--- a/deploy/prod.env\n+++ b/deploy/prod.env\n-SEARCH_TIMEOUT_MS=6000\n+SEARCH_TIMEOUT_MS=1500"
    salience = Salience([listing, diff])
    # The `+` is the diff's structure: the line is a changed setting, not a listing's entry.
    assert template_of("+SEARCH_TIMEOUT_MS=1500") == "+ #"
    assert template_of("tests/test_orders_7.py") == "#"
    added, *_ = salience.information("+SEARCH_TIMEOUT_MS=1500")
    removed, *_ = salience.information("-SEARCH_TIMEOUT_MS=6000")
    entry, *_ = salience.information("tests/test_orders_7.py")
    assert added > removed > entry


def test_it_counts_a_closing_line_that_reports_a_failure_as_one_report() -> None:
    from compaction_app.evidence import Salience

    run = (
        "FAILED tests/test_refunds.py::test_refund_rounding - AssertionError\n"
        "===================== 1 failed, 52 passed in 3.10s ====================="
    )
    earlier = "\n".join(
        f"{'=' * 21} {40 + k} passed, 1 skipped in 2.{k}0s {'=' * 21}" for k in range(5)
    )
    salience = Salience([earlier, run])
    failed_test, *_ = salience.information(run.splitlines()[0])
    tally, outcome, signal = salience.information(run.splitlines()[1])
    assert outcome and signal
    # The failing test's name tells what the run's tally only counts.
    assert failed_test >= tally
