"""The dashboard, the API docs (Swagger UI) and the admin work under the Content-Security-
Policy in a real browser (headless Chromium via Playwright): pages render, scripts run, the
websocket connects, and the browser reports no CSP violation."""

from __future__ import annotations

import pytest

from tests.dashboard.test_dashboard_browser import (
    in_thread,
    log_in,
    near_limit_session,
    new_page,
    ws_ready,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, scope="module")
def _orm_beside_playwright():
    # As in test_dashboard_browser.py: Playwright's loop on the main thread is not async code.
    # For the whole module, so the database flush after each test is covered too.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


WATCH_VIOLATIONS = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline'));
});
"""


def _watched(browser):
    page, dialogs = new_page(browser)
    page.add_init_script(WATCH_VIOLATIONS)
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    return page, dialogs, console


def _violations(page, console: list[str]) -> list[str]:
    seen = list(page.evaluate("window.__csp || []"))
    return seen + [text for text in console if "Content Security Policy" in text]


def test_it_runs_the_dashboard_under_the_csp(worker, alice, staff, live_url, browser):
    session = in_thread(near_limit_session, alice, title="CSP check")
    page, dialogs, console = _watched(browser)
    log_in(page, live_url, "staff")
    assert page.locator(f"#row-{session.pk}").count() == 1
    assert _violations(page, console) == []
    page.get_by_role("link", name="CSP check").click()
    page.wait_for_url(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)  # htmx and its websocket extension ran and connected
    page.locator("#event-search").press_sequentially("def")
    page.locator("#search-results .search-hits, #search-results .empty").first.wait_for()
    assert _violations(page, console) == []
    assert dialogs.alerts == []


def test_it_runs_the_api_docs_under_the_csp(alice, live_url, browser):
    page, _, console = _watched(browser)
    page.goto(f"{live_url}/api/v1/docs/")
    # Swagger UI rendered the schema it fetched: the title and an operation.
    page.get_by_text("Context Ledger API").first.wait_for()
    page.locator(".opblock").first.wait_for()
    assert _violations(page, console) == []


def test_it_runs_the_admin_under_the_csp(staff, live_url, browser):
    in_thread(lambda: type(staff).objects.filter(pk=staff.pk).update(is_superuser=True))
    page, _, console = _watched(browser)
    page.goto(f"{live_url}/admin/login/")
    page.get_by_label("Username").fill("staff")
    page.get_by_label("Password").fill("pw-staff")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_url}/admin/")
    page.goto(f"{live_url}/admin/auth/user/add/")
    page.locator("#id_username").wait_for()
    page.goto(f"{live_url}/admin/sessions_app/session/")
    page.locator("#changelist").wait_for()
    assert _violations(page, console) == []
