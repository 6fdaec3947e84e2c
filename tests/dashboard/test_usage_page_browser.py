"""The usage page in headless Chromium at 1,400 and 390 px: totals, server-drawn charts of
calls, cost, tokens by kind and latency per hour, the groups' table, in the viewer's time
zone (the browser's own, through the ledger_tz cookie). Pictures: docs/img."""

from __future__ import annotations

import datetime

from django.utils import timezone

from sessions_app.calls import call_record
from sessions_app.services import session_create
from tests.dashboard.test_dashboard_browser import (
    _orm_beside_playwright,  # noqa: F401  (an autouse fixture)
    in_thread,
    log_in,
    new_page,
    shot,
)


def _seed(owner) -> None:
    now = timezone.now()
    session = session_create(owner=owner, model="gpt-4o", title="Nightly refactor")
    for hour in range(20):
        for n, model in enumerate(("gpt-4o", "gpt-4o", "gpt-4o-mini", "claude-3.5-sonnet")):
            status = "provider_error" if (hour + n) % 9 == 0 else "ok"
            call_record(
                session_id=session.pk,
                owner_id=session.owner_id,
                started_at=now - datetime.timedelta(hours=hour, minutes=n * 7),
                wire="anthropic" if model.startswith("claude") else "openai",
                status=status,
                model_requested=model,
                model_served=model,
                prompt_tokens=4000 + 300 * hour,
                cached_input_tokens=2500 + 200 * hour,
                completion_tokens=300,
                ttfb_ms=300 + 40 * n,
                total_ms=900 + 60 * hour + 100 * n,
                gateway_ms=3,
            )


def test_it_charts_usage_per_hour_on_a_desktop_and_a_phone(worker, alice, live_url, browser):
    in_thread(_seed, alice)
    for width, name in ((1400, "usage-page.png"), (390, "usage-page-phone.png")):
        page, dialogs = new_page(browser, width=width, height=900)
        page.context.add_init_script(
            "try { sessionStorage.setItem('ledger_tz_reloaded', '1') } catch (e) {}"
        )
        log_in(page, live_url, "alice")
        page.context.add_cookies([{"name": "ledger_tz", "value": "Europe/Paris", "url": live_url}])
        page.goto(f"{live_url}/usage/?range=24h&bucket=hour&group=model")
        assert page.locator("#u-calls").inner_text() == "80"
        assert "Europe/Paris" in page.locator("main, body").first.inner_text()
        for chart in ("calls", "cost", "tokens"):
            assert page.locator(f"#chart-{chart} rect").count() > 10
        assert page.locator("#chart-latency path").count() == 2
        rows = page.locator("#usage-groups tbody tr")
        assert rows.count() == 3 and "gpt-4o" in rows.first.inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        shot(page, name)
        assert not dialogs.alerts
        page.context.close()
