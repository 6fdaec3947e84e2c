"""The session page of a session with twelve compactions after an idle gap, in headless
Chromium at a desktop and a phone width (issue 33): the chart's labels, measured as the
browser lays them out, never overlap, by event and by time; every run is reachable from the
page; a run's before / after comes into view.

One page load per width; the axis switch and "show all" swap their parts in place.
"""

from __future__ import annotations

import pytest

from tests.dashboard.test_dashboard_browser import (
    SHOTS,
    _orm_beside_playwright,  # noqa: F401  (an autouse fixture)
    in_thread,
    log_in,
    new_page,
    wait_for_js,
    ws_ready,
)
from tests.support.long_session import completed_runs, runs_after_idle_gap

# Every label of the chart on show, as the browser lays it out: the drop labels, the
# threshold labels, the limit's, the axes'.
LABEL_BOXES = """() => {
    const svg = [...document.querySelectorAll('#chart svg.chart')]
        .find(s => s.getBoundingClientRect().width > 0 && !s.classList.contains('input-strip'));
    const box = t => { const r = t.getBoundingClientRect();
        return {text: t.textContent.trim(), l: r.left, t: r.top, r: r.right, b: r.bottom}; };
    const all = sel => [...svg.querySelectorAll(sel)].map(box);
    return {
        variant: svg.classList.contains('chart-wide') ? 'wide' : 'narrow',
        drops: all('text.mark-text'),
        thresholds: all('text.threshold-text'),
        others: all('text.axis:not(.threshold-text)'),
        marks: svg.querySelectorAll('g.mark').length,
    };
}"""


def oldest_run_figures(session) -> tuple[int, int]:
    from compaction_app.models import CompactionRun

    run = CompactionRun.objects.filter(session=session).order_by("created_at").first()
    assert run is not None and run.tokens_before is not None and run.tokens_after is not None
    return run.tokens_before, run.tokens_after


def chart_shot(page, name: str, *, part: str = "#chart") -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator(part).screenshot(path=str(SHOTS / name))


def _overlap(a: dict, b: dict) -> bool:
    return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]


def assert_no_label_overlaps(page, axis: str) -> dict:
    boxes = page.evaluate(LABEL_BOXES)
    assert boxes["marks"] == 12, boxes
    assert boxes["drops"], f"no drop label at all ({axis})"
    assert len(boxes["thresholds"]) == 2, boxes
    drops, fixed = boxes["drops"], boxes["thresholds"] + boxes["others"]
    for index, drop in enumerate(drops):
        for other in drops[index + 1 :] + fixed:
            assert not _overlap(drop, other), (axis, boxes["variant"], drop, other)
    for index, label in enumerate(fixed):
        for other in fixed[index + 1 :]:
            if label in boxes["thresholds"] or other in boxes["thresholds"]:
                assert not _overlap(label, other), (axis, boxes["variant"], label, other)
    return boxes


@pytest.mark.parametrize("width,height", [(1400, 900), (390, 844)], ids=["desktop", "phone"])
def test_it_keeps_twelve_runs_after_an_idle_gap_legible_and_reachable(
    worker, alice, live_url, browser, width, height
):
    session = in_thread(runs_after_idle_gap, alice, runs=12, title="Twelve runs after a quiet day")
    assert in_thread(completed_runs, session) == 12
    page, dialogs = new_page(browser, width=width, height=height)
    log_in(page, live_url, "alice")
    page.goto(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)
    assert page.evaluate("document.documentElement.scrollWidth") <= width

    by_event = assert_no_label_overlaps(page, "seq")
    chart_shot(page, f"many-runs-seq-{width}.png")
    page.locator("#axis-time").click()
    wait_for_js(
        page,
        "[...document.querySelectorAll('#chart svg.chart > title')]"
        ".every(t => t.textContent.includes('by time'))",
    )
    by_time = assert_no_label_overlaps(page, "time")
    chart_shot(page, f"many-runs-time-{width}.png")
    # The phone's drawing has half the room: fewer labels, but the newest always.
    assert by_event["drops"] and by_time["drops"]

    # Folded events look folded: the stretch opens in one click, each folded event muted and
    # dashed with the compaction it went into; the messages kept between them look as ever.
    stretch = page.locator("#timeline li.fold-run")
    assert stretch.count() == 1
    stretch.locator("details.fold > summary").first.click()
    folded = stretch.locator("li.entry.folded")
    kept = stretch.locator("li.entry:not(.folded)")
    assert folded.count() > 0 and kept.count() > 0
    assert folded.first.is_visible()
    assert folded.first.locator(".badge.folded").inner_text().startswith("folded at #")
    assert kept.first.locator(".badge.kept").inner_text() == "in context"
    look = """el => { const box = el.querySelector(':scope > details.entry-box');
        const s = getComputedStyle(box);
        return [s.borderTopStyle, s.backgroundColor,
                getComputedStyle(el.querySelector('.who')).color]; }"""
    folded_look, kept_look = folded.first.evaluate(look), kept.first.evaluate(look)
    assert folded_look[0] == "dashed" and kept_look[0] != "dashed", (folded_look, kept_look)
    assert folded_look[2] != kept_look[2], (folded_look, kept_look)
    chart_shot(page, f"many-runs-folded-{width}.png", part="#timeline")

    # Every run is reachable: "show all" brings the whole history in place.
    history = page.locator("#history table.history tbody tr")
    assert history.count() == 5
    page.locator("#history-all").click()
    wait_for_js(page, "document.querySelectorAll('#history table.history tbody tr').length == 12")
    assert page.locator("#history-all").count() == 0
    # The oldest run's before / after opens and scrolls into view.
    oldest = history.last
    oldest.locator("a.run-open").click()
    page.locator("#run-detail .before-after").wait_for()
    wait_for_js(
        page,
        """(() => { const r = document.getElementById('run-detail').getBoundingClientRect();
                    return r.top >= -1 && r.top < window.innerHeight / 2; })()""",
    )
    first = in_thread(oldest_run_figures, session)
    assert f"{first[0]:,}" in page.locator("#run-detail .side-before").inner_text()
    assert f"{first[1]:,}" in page.locator("#run-detail .side-after").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert dialogs.alerts == []
    page.context.close()
