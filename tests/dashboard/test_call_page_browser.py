"""A call's page in headless Chromium at 1,400 and 390 px: the request as sent beside what
was forwarded (the summary, each message's fate), the latency split, usage and cost by kind,
masked headers, and links to the run and the neighbouring calls; another user gets a 404.
The pictures docs/dashboard.md shows are these screenshots (docs/img)."""

from __future__ import annotations

from tests.dashboard.test_dashboard_browser import (
    _orm_beside_playwright,  # noqa: F401  (an autouse fixture)
    in_thread,
    log_in,
    new_page,
    shot,
)
from tests.support.calls import compacting_conversation
from tests.support.gateway_live import token_for


def test_it_shows_a_compacting_calls_story_on_a_desktop_and_a_phone(
    worker, alice, bob, live_url, upstream, browser
):
    history, calls = compacting_conversation(live_url, upstream, alice, "page", orm=in_thread)
    call = calls[-1]
    key = in_thread(token_for, alice)
    for width, name in ((1400, "call-page.png"), (390, "call-page-phone.png")):
        page, dialogs = new_page(browser, width=width, height=900)
        log_in(page, live_url, "alice")
        page.goto(f"{live_url}/calls/{call.pk}/")
        assert page.locator("#call-fit").inner_text().startswith("compacted")
        assert page.locator("#call-run").count() == 1
        assert page.locator(".summary-row").count() == 1
        assert page.locator(".story-row.fate-summarized").count() >= 1
        # The system prompt and the question went as sent.
        assert page.locator("#msg-0 .fwd").inner_text().startswith("kept")
        last = page.locator(f"#msg-{len(history) - 1}")
        assert "Status?" in last.inner_text() and "kept" in last.inner_text()
        assert "ms" in page.locator("#lat-gateway").inner_text()
        assert page.locator("#usage-total").inner_text().startswith("$")
        headers = page.locator("#call-headers").inner_text()
        assert "Bearer ••••••" in headers and key not in page.content()
        assert page.locator("#call-prev").get_attribute("href") == f"/calls/{calls[-2].pk}/"
        # Nothing runs off the side of a phone.
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        shot(page, name)
        assert not dialogs.alerts
        page.context.close()

    page, _ = new_page(browser)
    log_in(page, live_url, "bob")
    response = page.goto(f"{live_url}/calls/{call.pk}/")
    assert response is not None and response.status == 404
    page.context.close()
