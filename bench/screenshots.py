"""The dashboard's screenshots in the docs, made the way a newcomer would see them: a fresh
`manage.py serve` (embedded profile, a temporary VAR_DIR) whose gateway forwards to the
provider stand-in, a coding-agent session driven through the gateway with the OpenAI SDK
(tool calls, results, a few failed calls, several compactions on a small window), then
headless Debian Chromium through Playwright.

    .venv/bin/python bench/screenshots.py [--turns 60] [--out-dir .]

Writes (relative to --out-dir, the checkout by default):
- docs/img/dashboard.png          the session page's first screen at 1,280 px (README, dashboard.md)
- static/screenshots/session-page.png        the whole session page at 1,280 px
- static/screenshots/session-page-phone.png  the session page's top at 390 px
- docs/img/calls.png              the calls table of that session at 1,280 px

Needs /usr/bin/chromium (apt-get install chromium).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TITLE = "Fix the flaky payment tests"
CONTEXT_LIMIT = 10_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _api(base: str, token: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{base}/api/v1/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _serve(*, var_dir: str, upstream: str, port: int) -> tuple[subprocess.Popen, str]:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
        "VAR_DIR": var_dir,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LEDGER_OPENAI_UPSTREAM": f"{upstream}/v1",
        "LEDGER_ANTHROPIC_UPSTREAM": upstream,
        "API_THROTTLE_RATE": "off",
    }
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdout is not None
    token = ""
    for line in server.stdout:
        found = re.match(r"API token: (\w+)", line)
        if found:
            token = found.group(1)
        if line.startswith("Serving on"):
            break
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server, token
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise SystemExit("the server did not start")


def _drive(*, base: str, token: str, standin, turns: int) -> str:
    """A coding agent's session through the gateway: each turn a user request, a tool call,
    its (long) result and the agent's answer; every ninth turn the provider fails once."""
    import openai

    from compaction_app.testkit.provider_standin import Step, rate_limited, server_error

    session = _api(
        base,
        token,
        "sessions",
        {
            "model": "gpt-4o",
            "title": TITLE,
            "contextLimit": CONTEXT_LIMIT,
            "settings": {"cooldownSeconds": 0},
        },
    )["id"]
    client = openai.OpenAI(
        api_key="sk-dummy",
        base_url=f"{base}/gateway/openai/v1",
        default_headers={"X-Ledger-Key": token, "X-Ledger-Session": session},
        max_retries=0,
    )
    history: list[dict] = [{"role": "system", "content": "You are a careful coding agent."}]
    for turn in range(turns):
        history.append(
            {"role": "user", "content": f"Step {turn}: run tests/payments and fix what fails."}
        )
        call_id = f"call_{turn}"
        standin.script(
            Step(tool_calls=((call_id, "run_tests", '{"path": "tests/payments"}'),), text="")
        )
        if turn % 9 == 4:
            standin.script(server_error(502) if turn % 2 else rate_limited(retry_after=0))
        log = "\n".join(
            f"tests/payments/test_refund.py::test_case_{n} {'FAILED' if n == turn % 30 else 'PASSED'}"
            for n in range(30)
        )
        standin.script(
            Step(
                text=f"test_case_{turn % 30} fails with KeyError 'currency' in "
                f"payments/refund.py:{40 + turn}; I added the default and the suite passes."
            )
        )
        for _ in range(3):  # a failed call is answered again, as an agent would retry it
            try:
                reply = client.chat.completions.create(model="gpt-4o", messages=history)
            except openai.APIError:
                continue
            message = reply.choices[0].message
            if message.tool_calls:
                history.append(message.model_dump(exclude_none=True))
                history.append(
                    {
                        "role": "tool",
                        "tool_call_id": call_id,
                        "content": f"{log}\n== 1 failed, 29 passed in 3.{turn}s ==",
                    }
                )
                continue
            history.append({"role": "assistant", "content": message.content})
            break
        time.sleep(0.3)  # an agent's pace: the page's live updates keep up
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = _api(base, token, f"sessions/{session}/compactions")["results"]
        if all(run["status"] in ("completed", "failed") for run in runs):
            break
        time.sleep(0.5)
    return session


def _shoot(*, base: str, session: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    from compaction_app.testkit.browser import launch_chromium

    made: list[Path] = []

    def path(relative: str) -> str:
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        made.append(target)
        return str(target)

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        for width, height in ((1280, 900), (390, 844)):
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            page.goto(f"{base}/accounts/login/")
            page.get_by_label("Username").fill("demo")
            page.get_by_label("Password").fill("demo")
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(f"{base}/")
            page.goto(f"{base}/sessions/{session}/")
            page.wait_for_load_state("networkidle")
            # A picture of a page that scrolls sideways would hide what it shows.
            overflow = page.evaluate(
                "[...document.querySelectorAll('.scroll')]"
                ".filter(s => s.scrollWidth > s.clientWidth).map(s => s.parentElement.id)"
            )
            if overflow:
                print(f"warning: at {width} px these parts scroll sideways: {overflow}")
            if width > 1000:
                page.screenshot(path=path("docs/img/dashboard.png"))
                # The page with a folded stretch open, as a reader explores it.
                stretch = page.locator("#timeline li.fold-run details.fold > summary")
                if stretch.count():
                    stretch.first.click()
                page.screenshot(path=path("static/screenshots/session-page.png"), full_page=True)
                page.goto(f"{base}/sessions/{session}/calls/")
                page.wait_for_load_state("networkidle")
                page.screenshot(path=path("docs/img/calls.png"))
            else:
                page.screenshot(
                    path=path("static/screenshots/session-page-phone.png"),
                    full_page=True,
                    clip={"x": 0, "y": 0, "width": width, "height": 1700},
                )
            context.close()
        browser.close()
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--out-dir", type=Path, default=ROOT)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from compaction_app.testkit.provider_standin import ProviderStandIn

    port = _free_port()
    with ProviderStandIn() as standin, tempfile.TemporaryDirectory(prefix="shots-") as var_dir:
        standin.keep_requests = False
        server, token = _serve(var_dir=var_dir, upstream=standin.base, port=port)
        try:
            base = f"http://127.0.0.1:{port}"
            session = _drive(base=base, token=token, standin=standin, turns=args.turns)
            usage = _api(base, token, f"sessions/{session}/usage")
            runs = _api(base, token, f"sessions/{session}/compactions")["count"]
            calls = _api(base, token, f"sessions/{session}/calls")
            print(
                f"session {session}: {usage['contextTokens']:,} of {CONTEXT_LIMIT:,} tokens, "
                f"{runs} compactions, {calls.get('count', '?')} calls"
            )
            for made in _shoot(base=base, session=session, out=args.out_dir):
                print(f"wrote {made.relative_to(args.out_dir)}")
        finally:
            server.terminate()
            server.wait(timeout=20)


if __name__ == "__main__":
    main()
