"""Every shell and Python block of README.md and docs/*.md runs, in order per file, against a
live server (tests/live_ledger.py) whose gateway forwards to the local provider stand-in
(tests/provider_standin.py), so a snippet that rots fails CI.

How a block runs:
- ```bash / ```sh / ```shell blocks run in bash with `set -eo pipefail`, and `curl` fails on an
  HTTP error (`--fail-with-body`): a 404 or 409 in a walk-through is a failure, not output.
  Variables a block sets carry over to the file's next shell blocks (the walk-through's
  `$T`, `$B`, `$S`).
- ```python blocks run each in a fresh interpreter of this environment.
- The blocks find the server in `$LEDGER` (`os.environ.get("LEDGER", …)` in Python), as the
  README tells people to set it: here the live server's address, on a port the test chose
  (nothing is rewritten in the code; a block that names a port of its own fails). The token
  placeholders people replace by hand (`<ledger token>`, `<the token serve printed>`, `<token
  printed by serve>`, `<your API token>`) are replaced by a real API token. The environment
  also holds TOKEN and the provider keys the SDK examples say to export (OPENAI_API_KEY,
  ANTHROPIC_API_KEY, GEMINI_API_KEY: the stand-in accepts anything).
- SNIPPETS_SHOW=1 prints every block's output (to keep the docs' "→ …" comments true).
- A block can opt out with `<!-- snippet: skip (reason) -->` on the line before its fence;
  the reason is required.
- A block marked `<!-- snippet: own-server (reason) -->` starts servers of its own (the
  README's first-five-minutes block: the stand-in and `manage.py serve` in the background). It
  runs as written from the checkout (its `.venv/bin/python`, `manage.py`), in a process group
  of its own, with its own VAR_DIR and free ports in `$PORT` and `$STANDIN_PORT` (other
  servers on the machine may hold 8000 and 9100), and nothing is replaced. Once it returns, the session
  it printed must compact within OWN_SERVER_COMPACTS seconds; then its process group (the
  servers it left running, and no other process) is stopped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.profile_independent

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
FENCE = re.compile(r"^```([A-Za-z]+)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"^<!--\s*snippet:\s*skip\b(.*?)-->\s*$")
OWN_SERVER = re.compile(r"^<!--\s*snippet:\s*own-server\b(.*?)-->\s*$")
OWN_SERVER_COMPACTS = 60
OPEN_LINE = re.compile(r"Open (http://127\.0\.0\.1:\d+)/sessions/([0-9a-f-]+)/")
TOKEN_LINE = re.compile(r"API token[^:]*: ([0-9a-f]{40})")
REASON = re.compile(r"^\s*\((.*\S.*)\)\s*$")
TOKEN_PLACEHOLDERS = (
    "<ledger token>",
    "<the token serve printed>",
    "<token printed by serve>",
    "<your API token>",
)
# A port written into a runnable line (not a comment, not the `$LEDGER` / `$PORT` fallback).
HARD_CODED_PORT = re.compile(r"127\.0\.0\.1:(?!\$\{)\d+")
DEFAULT_FALLBACK = re.compile(
    r'os\.environ\.get\("LEDGER", "http://127\.0\.0\.1:8000"\)|\$\{LEDGER:-http://127\.0\.0\.1:8000\}'
)
BLOCK_TIMEOUT = 45
SHELL_PRELUDE = """set -eo pipefail
curl() { command curl --fail-with-body "$@"; }
[ -f "$SNIPPET_STATE" ] && source "$SNIPPET_STATE"
"""
# Saves the block's variables for the next shell block of the file (not bash's own).
SHELL_EPILOGUE = """
__status=$?
declare -p $(compgen -v | grep -Ev '^(BASH.*|SHELLOPTS|EUID|PPID|UID|GROUPS|FUNCNAME|PIPESTATUS|DIRSTACK|RANDOM|SRANDOM|SECONDS|LINENO|EPOCH.*|HIST.*|COMP.*|OPT.*|_|SNIPPET_STATE|PWD|OLDPWD|SHLVL)$') > "$SNIPPET_STATE" 2>/dev/null || true
exit $__status
"""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    kind: str  # shell | python
    code: str
    skip: str | None  # the reason, when marked
    own_server: bool = False

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        kind = RUNNABLE.get(match.group(1).lower())
        if kind is None:
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = [ln for ln in text[: match.start()].splitlines() if ln.strip()]
        marker = MARKER.match(before[-1].strip()) if before else None
        own = OWN_SERVER.match(before[-1].strip()) if before else None
        skip = None
        if marker is not None:
            reason = REASON.match(marker.group(1))
            skip = reason.group(1).strip() if reason else ""
        if own is not None and not REASON.match(own.group(1)):
            skip = ""  # a reason is required here too
        found.append(
            Block(
                path=path,
                line=line,
                kind=kind,
                code=match.group(2),
                skip=skip,
                own_server=own is not None,
            )
        )
    return found


def test_it_requires_a_reason_for_every_skipped_block():
    unexplained = [str(b) for path in DOC_FILES for b in blocks_of(path) if b.skip == ""]
    assert not unexplained, f"skip markers without a reason: {unexplained}"


def test_it_finds_the_readmes_runnable_blocks():
    blocks = blocks_of(ROOT / "README.md")
    assert sum(b.kind == "shell" for b in blocks) >= 3
    assert sum(b.kind == "python" and b.skip is None for b in blocks) >= 3


@pytest.fixture(scope="module")
def server():
    from compaction_app.testkit.provider_standin import ProviderStandIn
    from tests.support.live_ledger import live_ledger

    with ProviderStandIn() as upstream:
        upstream.keep_requests = False
        with live_ledger(
            LEDGER_OPENAI_UPSTREAM=upstream.openai_url,
            LEDGER_ANTHROPIC_UPSTREAM=upstream.anthropic_url,
            LEDGER_GEMINI_UPSTREAM=upstream.gemini_url,
        ) as live:
            yield live


def _substitute(code: str, *, token: str) -> str:
    for placeholder in TOKEN_PLACEHOLDERS:
        code = code.replace(placeholder, token)
    return code


def _run(block: Block, *, env: dict[str, str], workdir: Path, state: Path) -> None:
    code = _substitute(block.code, token=env["TOKEN"])
    if block.kind == "shell":
        command = ["bash", "-c", SHELL_PRELUDE + code + SHELL_EPILOGUE]
    else:
        script = workdir / f"block_{block.line}.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    try:
        result = subprocess.run(
            command,
            cwd=workdir,
            env={**env, "SNIPPET_STATE": str(state)},
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block}: still running after {BLOCK_TIMEOUT} s")
    if os.environ.get("SNIPPETS_SHOW"):  # for writing the docs' "→ output" comments
        print(f"\n=== {block}\n{result.stdout}{result.stderr}")
    if result.returncode != 0:
        pytest.fail(
            f"{block} exited {result.returncode}\n--- stdout\n{result.stdout[-3000:]}"
            f"\n--- stderr\n{result.stderr[-3000:]}"
        )


def test_it_names_no_port_in_a_runnable_block():
    """Every walk-through reads the server's address from `$LEDGER` (and the own-server block
    its ports from `$PORT` / `$STANDIN_PORT`), so it runs on whatever port the server has."""
    written = [
        f"{block}: {line.strip()}"
        for path in DOC_FILES
        for block in blocks_of(path)
        if block.skip is None
        for line in block.code.splitlines()
        if not line.lstrip().startswith("#")
        and HARD_CODED_PORT.search(DEFAULT_FALLBACK.sub("", line.split(" # ")[0]))
    ]
    assert written == []


def test_it_runs_the_readmes_first_five_minutes_block_as_its_own_server():
    own = [b for b in blocks_of(ROOT / "README.md") if b.own_server]
    assert len(own) == 1 and own[0].kind == "shell" and own[0].skip is None
    # It stops the "Serve the app" server by its pid file, never by a name (`pkill -f` would
    # stop every other server of the machine).
    assert "serve --stop" in own[0].code and "pkill" not in own[0].code


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, token: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _run_own_server(block: Block, *, env: dict[str, str], workdir: Path) -> None:
    code = block.code
    log = workdir / f"block_{block.line}.log"
    own_env = {
        **env,
        "VAR_DIR": str(workdir / f"var-{block.line}"),
        "API_THROTTLE_RATE": "off",
        # Where it serves and where its stand-in listens: ports the test chose.
        "PORT": str(_free_port()),
        "STANDIN_PORT": str(_free_port()),
    }
    for name in ("LEDGER", "TOKEN"):  # the block makes its own
        own_env.pop(name, None)
    # A file, not a pipe: the servers it leaves running would hold a pipe open.
    with log.open("w") as sink:
        process = subprocess.Popen(
            ["bash", "-c", SHELL_PRELUDE + code],
            cwd=ROOT,
            env={**own_env, "SNIPPET_STATE": str(workdir / "own-server-state.sh")},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            status = process.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{block}: still running after {BLOCK_TIMEOUT} s\n{log.read_text()[-3000:]}"
            )
        if status != 0:
            pytest.fail(f"{block} exited {status}\n{log.read_text()[-3000:]}")
        deadline = time.monotonic() + OWN_SERVER_COMPACTS
        runs: list[dict] = []
        while time.monotonic() < deadline:
            opened, token = OPEN_LINE.search(log.read_text()), TOKEN_LINE.search(log.read_text())
            if opened and token:
                base, session = opened.groups()
                page = _get(f"{base}/api/v1/sessions/{session}/compactions", token.group(1))
                runs = [run for run in page["results"] if run["status"] == "completed"]
                if runs:
                    break
            time.sleep(0.5)
        assert runs, (
            f"{block}: no compaction within {OWN_SERVER_COMPACTS} s\n{log.read_text()[-3000:]}"
        )
        if os.environ.get("SNIPPETS_SHOW"):
            print(f"\n=== {block}\n{log.read_text()}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            for _ in range(100):
                os.killpg(process.pid, 0)
                time.sleep(0.1)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_it_runs_every_block_in_order(path, server, tmp_path):
    runnable = [b for b in blocks_of(path) if b.skip is None]
    if not runnable:
        pytest.skip("no runnable blocks")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "LEDGER": server.base_url,
        "TOKEN": server.tokens["alice"],
        "OPENAI_API_KEY": "sk-standin",
        "ANTHROPIC_API_KEY": "sk-ant-standin",
        "GEMINI_API_KEY": "gemini-standin",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "VAR_DIR": str(tmp_path / "var"),
    }
    state = tmp_path / "shell-state.sh"
    for block in runnable:
        if block.own_server:
            _run_own_server(block, env=env, workdir=tmp_path)
        else:
            _run(block, env=env, workdir=tmp_path, state=state)
