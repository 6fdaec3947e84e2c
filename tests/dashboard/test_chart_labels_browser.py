"""The session chart's labels as Chromium lays them out (issue 39): on a 60-turn session with a
dozen compactions and reverts, at 1,400 and 390 px, by event and by time, no label box meets
another label, a threshold line, the limit line or the data line."""

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
from tests.support.long_session import sixty_turns_with_runs_and_reverts

# Every label of the chart on show (drop, threshold, limit and axis labels) and every line
# (the thresholds', the limit's: horizontal boxes) with the data line sampled along its length,
# in the page's pixels.
MEASURE = """() => {
    const svg = [...document.querySelectorAll('#chart svg.chart')]
        .find(s => s.getBoundingClientRect().width > 0 && !s.classList.contains('input-strip'));
    const rect = e => { const r = e.getBoundingClientRect();
        return {text: (e.textContent || e.getAttribute('class')).trim(),
                l: r.left, t: r.top, r: r.right, b: r.bottom}; };
    const labels = [...svg.querySelectorAll('text')].map(rect);
    const lines = [...svg.querySelectorAll('line.threshold-line, line.limit-line')].map(rect);
    const path = svg.querySelector('path.line');
    const matrix = path.getScreenCTM();
    const total = path.getTotalLength();
    const samples = [];
    for (let d = 0; d <= total; d += 0.5) {
        const p = path.getPointAtLength(d);
        samples.push({x: matrix.a * p.x + matrix.c * p.y + matrix.e,
                      y: matrix.b * p.x + matrix.d * p.y + matrix.f});
    }
    return {variant: svg.classList.contains('chart-wide') ? 'wide' : 'narrow',
            labels, lines, samples,
            drops: svg.querySelectorAll('text.mark-text').length,
            thresholds: svg.querySelectorAll('text.threshold-text').length,
            marks: svg.querySelectorAll('g.mark').length};
}"""


def _meet(a: dict, b: dict) -> bool:
    return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]


def assert_labels_clear(page, where: str) -> dict:
    seen = page.evaluate(MEASURE)
    labels = seen["labels"]
    assert seen["marks"] >= 8 and seen["drops"], (where, seen["marks"], seen["drops"])
    for index, label in enumerate(labels):
        for other in labels[index + 1 :]:
            assert not _meet(label, other), (where, seen["variant"], label, other)
        for line in seen["lines"]:
            assert not _meet(label, line), (where, seen["variant"], label, line)
        # The data line (2 px wide) passes through no label.
        hit = next(
            (
                p
                for p in seen["samples"]
                if label["l"] - 1 < p["x"] < label["r"] + 1
                and label["t"] - 1 < p["y"] < label["b"] + 1
            ),
            None,
        )
        assert hit is None, (where, seen["variant"], label, hit)
    return seen


@pytest.mark.parametrize("width,height", [(1400, 900), (390, 844)], ids=["desktop", "phone"])
def test_it_keeps_every_chart_label_off_lines_and_labels(
    worker, alice, live_url, browser, width, height
):
    session = in_thread(sixty_turns_with_runs_and_reverts, alice, title="Sixty turns")
    page, dialogs = new_page(browser, width=width, height=height)
    log_in(page, live_url, "alice")
    page.goto(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)
    by_event = assert_labels_clear(page, "seq")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#chart").screenshot(path=str(SHOTS / f"chart-labels-seq-{width}.png"))
    page.locator("#axis-time").click()
    wait_for_js(
        page,
        "[...document.querySelectorAll('#chart svg.chart > title')]"
        ".every(t => t.textContent.includes('by time'))",
    )
    assert_labels_clear(page, "time")
    page.locator("#chart").screenshot(path=str(SHOTS / f"chart-labels-time-{width}.png"))
    # The thresholds keep their labels (moved along their lines where the data crosses).
    assert by_event["thresholds"] == 2, by_event["thresholds"]
    assert dialogs.alerts == []
    page.context.close()
