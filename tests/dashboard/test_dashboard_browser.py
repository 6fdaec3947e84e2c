"""The dashboard in a real browser: headless Chromium driven by Playwright, against daphne
serving the app in this process (embedded profile: in-memory channel layer and broker) with a
real Celery worker thread, so a compaction really runs and its notices really arrive over the
websocket.

Screenshots go to test-output/screenshots/ (docs/dashboard.md's pictures come from
bench/screenshots.py).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connections

from compaction_app.models import CompactionRun, RunStatus
from sessions_app.models import Session
from sessions_app.services import EventInput, event_append, session_create

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"
TIMEOUT_MS = 20_000

if not CHROMIUM.exists():
    if os.environ.get("CI") == "true":
        pytest.fail(
            "CI needs Chromium at /usr/bin/chromium (apt-get install chromium)", pytrace=False
        )
    pytest.skip(
        "no Chromium at /usr/bin/chromium (apt-get install chromium)", allow_module_level=True
    )

# Collects websocket frames and dialogs from the first moment of every page.
INIT_SCRIPT = """
window.__frames = [];
window.__wsOpen = false;
document.addEventListener('htmx:wsOpen', () => { window.__wsOpen = true; });
document.addEventListener('htmx:wsAfterMessage', (e) => { window.__frames.push(e.detail.message); });
// An out-of-band swap whose target is not on the page (htmx logs it as an error).
window.__oobMisses = [];
document.addEventListener('htmx:oobErrorNoTarget', (e) => {
    const c = e.detail && e.detail.content;
    window.__oobMisses.push(c && c.id ? '#' + c.id : String(c));
});
"""


@pytest.fixture(autouse=True)
def _orm_beside_playwright(monkeypatch):
    # Playwright's sync API keeps an asyncio loop registered on the main thread, which
    # Django's async-safety check mistakes for async code; the ORM calls here are plain
    # synchronous test code that never runs inside that loop.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


class Dialogs:
    """Every JavaScript dialog a page opens. hx-confirm's confirm() is accepted; any alert
    would mean injected script ran."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, dialog) -> None:
        self.seen.append((dialog.type, dialog.message))
        if dialog.type == "confirm":
            dialog.accept()
        else:
            dialog.dismiss()

    @property
    def alerts(self) -> list[tuple[str, str]]:
        return [seen for seen in self.seen if seen[0] != "confirm"]


def new_page(browser, *, width: int = 1280, height: int = 900):
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.add_init_script(INIT_SCRIPT)
    dialogs = Dialogs()
    page.on("dialog", dialogs)
    return page, dialogs


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")


def shot(page, name: str, *, height: int | None = None) -> Path:
    """A full-page screenshot, or its top `height` pixels."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    clip = None
    if height is not None:
        clip = {"x": 0, "y": 0, "width": page.viewport_size["width"], "height": height}
    page.screenshot(path=str(path), full_page=True, clip=clip)
    return path


def near_limit_session(owner, *, title: str) -> Session:
    """A session of 12 agent turns whose window is set so the context is at ~88 %."""
    session = session_create(
        owner=owner,
        model="gpt-4o",
        title=title,
        context_limit=100_000,
        system_prompt="You are a coding agent.",
        settings={"autoCompact": False},
    )
    events = []
    for turn in range(12):
        events += [
            EventInput(
                type="USER_MESSAGE", content=f"Please fix bug {turn} in src/module_{turn}.py"
            ),
            EventInput(
                type="TOOL_CALL",
                name="read_file",
                tool_call_id=f"c{turn}",
                content=f'{{"path": "src/module_{turn}.py"}}',
            ),
            EventInput(
                type="TOOL_RESULT",
                name="read_file",
                tool_call_id=f"c{turn}",
                content="def f():\n    return 1\n" * 20,
            ),
            EventInput(
                type="AGENT_MESSAGE",
                content=f"Fixed bug {turn}: KeyError in handler_{turn}. Decided to use a dict lookup.",
            ),
        ]
    events.append(EventInput(type="USER_MESSAGE", content=XSS))
    event_append(session=session, events=events)
    session.refresh_from_db()
    Session.objects.filter(pk=session.pk).update(context_limit=int(session.context_tokens / 0.88))
    session.refresh_from_db()
    return session


def in_thread(fn, *args, **kwargs):
    """Run ORM writes off the main thread: their on-commit websocket broadcasts use
    async_to_sync, which refuses a thread where Playwright's loop is registered."""

    def call():
        try:
            return fn(*args, **kwargs)
        finally:
            # The thread ends here: a connection it kept would never go back to the pool.
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


def wait_for_js(page, expression: str, *, timeout_ms: int = TIMEOUT_MS) -> None:
    """Wait until `expression` is truthy in the page. (Playwright's wait_for_function compiles
    its predicate with `new Function` inside the page, which the Content-Security-Policy
    forbids; an evaluate() from the test is the browser's own, outside the policy.)"""
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true in time: {expression}"
        time.sleep(0.05)


def ws_ready(page) -> None:
    wait_for_js(page, "window.__wsOpen === true")


def test_it_previews_runs_and_reverts_a_compaction_live_as_staff(
    worker, alice, staff, live_url, browser
):
    session = in_thread(near_limit_session, alice, title="Refactor the billing module")
    before = session.context_tokens
    page, dialogs = new_page(browser)
    log_in(page, live_url, "staff")

    row = page.locator(f"#row-{session.pk}")
    assert "level-warn" in (row.get_attribute("class") or "")
    shot(page, "sessions-list.png")

    page.get_by_role("link", name="Refactor the billing module").click()
    page.wait_for_url(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)
    assert page.locator("#ctx-tokens").inner_text() == f"{before:,}"
    # The hostile message is shown as text, and nothing ran.
    assert page.get_by_text(XSS).count() >= 1

    page.get_by_label("Strategy").select_option("summarize")
    page.get_by_role("button", name="Preview").click()
    page.locator("#preview-fold").wait_for()
    assert int(page.locator("#preview-fold").inner_text()) > 0
    projected = int(page.locator("#preview-after").inner_text().replace(",", ""))
    assert projected < before
    assert not CompactionRun.objects.filter(session=session).exists()

    page.evaluate("window.__stayed = true")  # gone if the page reloads
    page.get_by_role("button", name="Compact now (summarize)").click()
    wait_for_js(
        page, "document.getElementById('notice').textContent.startsWith('Compaction complete! ')"
    )
    frames = page.evaluate("window.__frames")
    assert any("Compacting conversation to reduce size…" in frame for frame in frames)
    notice = page.locator("#notice").inner_text()
    run = CompactionRun.objects.get(session=session)
    assert run.status == RunStatus.COMPLETED
    assert notice == (
        f"Compaction complete! {run.tokens_before:,} → {run.tokens_after:,} tokens "
        f"({round(100 * (run.tokens_before - run.tokens_after) / run.tokens_before)}% reduction), "
        f"{run.folded_count} events folded"
    )
    wait_for_js(
        page, f"document.getElementById('ctx-tokens').textContent === '{run.tokens_after:,}'"
    )
    assert page.evaluate("window.__stayed") is True
    assert page.locator(f"#run-{run.pk} .badge.completed").count() == 1
    assert page.locator("#chart svg.chart-wide .mark").count() == 1
    assert (page.locator("#summary pre").text_content() or "").strip()
    assert page.locator("#preview").count() == 0  # the finished run cleared the preview
    # Expand the events folded under the compaction. The run's last push may swap the
    # timeline in just after a click (closing the fold again): open it until its entries show.
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not page.locator("#timeline details.fold li.entry").first.is_visible():
        assert time.monotonic() < deadline, "the folded events never showed"
        if not page.locator("#timeline details.fold").first.evaluate("d => d.open"):
            page.locator("#timeline details.fold > summary").first.click()
        time.sleep(0.1)
    shot(page, "session-page.png")

    page.locator("#revert-btn").click()
    wait_for_js(
        page, "document.getElementById('notice').textContent.startsWith('Compaction reverted')"
    )
    wait_for_js(page, f"document.getElementById('ctx-tokens').textContent === '{before:,}'")
    assert page.locator(f"#run-{run.pk} .badge.reverted").count() == 1
    assert page.evaluate("window.__stayed") is True
    shot(page, "session-page-reverted.png")
    assert dialogs.alerts == []
    assert [kind for kind, _ in dialogs.seen] == ["confirm"]
    # Every fragment the compaction and the revert pushed found its place on the page.
    assert page.evaluate("window.__oobMisses") == []
    page.context.close()


def test_it_shows_a_user_no_controls_and_refuses_a_forged_post(worker, alice, live_url, browser):
    session = in_thread(near_limit_session, alice, title="Alice's own session")
    page, dialogs = new_page(browser, width=375, height=812)  # a phone
    log_in(page, live_url, "alice")
    shot(page, "sessions-list-phone.png")
    page.goto(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)
    assert page.locator("#controls").count() == 0
    assert page.get_by_role("button", name="Revert").count() == 0
    assert page.get_by_text(XSS).count() >= 1
    # Readable at phone width: nothing forces sideways scrolling.
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    shot(page, "session-page-phone.png", height=1600)

    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    forged = page.request.post(
        f"{live_url}/sessions/{session.pk}/compact/",
        form={"strategy": "trim"},
        headers={"X-CSRFToken": token, "Referer": f"{live_url}/sessions/{session.pk}/"},
    )
    assert forged.status == 403
    assert not CompactionRun.objects.filter(session=session).exists()
    assert dialogs.seen == []
    page.context.close()
