"""Cache benchmark: what a long agent conversation costs through the gateway when the
provider bills prompt caching the way Anthropic does.

A child process (the embedded profile by default) migrates a throwaway database, starts a
caching provider stand-in in a thread and the app in a daphne subprocess, then replays the
same 200-call agent conversation (a coding agent: a task, three tool calls with file-sized
results, an answer; again) through the gateway's Anthropic endpoint under three modes:

(a) per-call pruning — the gateway's fitting as it was before block compaction: between the
    compact threshold and the hard limit it drops a different oldest slice on every call. The
    current tree no longer fits that way, so this mode runs against a checkout of the code
    before that work (`--root a=DIR`, e.g. a git worktree of commit da3277e); without
    `--root` it runs this tree's fitting and the ratio below is not judged;
(b) block compaction — compact once down to `fitTargetRatio` of the window, then forward the
    previous forwarded request plus the new turns until the next crossing. Chosen by the
    session setting `fitTargetRatio`; a build without that setting runs its own fitting and
    the table says so;
(c) the client alone — `X-Ledger-Fit: off`, the whole history every call, until the history
    no longer fits the window and the provider refuses it.

The stand-in caches like Anthropic: explicit `cache_control` breakpoints (at most 4), a
prefix is looked up at the block boundaries up to 20 blocks before each breakpoint, written
when at least 1,024 tokens long, and lives 5 minutes from its last use (on a simulated
clock: one call every CALL_SECONDS). It prices every call with genai-prices through
sessions_app.pricing: cache reads at the model's cache-read rate (0.1× input for Claude),
writes at the cache-write rate (1.25×), the rest at the input rate.

Counted per mode: calls served; prefix-stable calls (the forwarded request begins with the
previous forwarded request, block for block, cache markers aside); the cache hit rate (cache
reads ÷ all input tokens); input tokens; dollars (the stand-in's bill), and whether the
ledger's own `/usage` costUsd agrees with it (the gateway recorded the cache figures the
stand-in reported).

Each checkout runs in a child process of its own, on its own throwaway database migrated by
its own code (its daphne started from its directory, that directory first on PYTHONPATH); the
stand-in's calls are priced by the parent with this tree's pricing.

    git worktree add /tmp/ledger-da3277e da3277e
    .venv/bin/python bench/bench_cache.py --root a=/tmp/ledger-da3277e \
        [--profile embedded|postgres|both] [--calls 200] [--modes abc]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(1, str(ROOT))
from harness import Row, emit, load_average, report, run_child  # noqa: E402
from harness import row as _row  # noqa: E402

PG_DB = "bench_cache"
MODEL = "claude-3.5-sonnet"
WINDOW = 60_000  # the session's context window (tokens)
CALLS = 200
CALL_SECONDS = 15.0  # simulated time between calls (the cache's 5-minute clock)
CACHE_TTL = 300.0
CACHE_MIN_TOKENS = 1024
MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
TOOLS_PER_TASK = 3
TARGET_RATIO = 0.40  # (b)'s cost ≤ 40 % of (a)'s

SYSTEM_TEXT = "You are a careful coding agent working in a large Python repository. " + " ".join(
    f"Rule {n}: read the relevant module before editing, keep functions small, run the "
    f"tests for module_{n} after each change, and report what changed and why."
    for n in range(40)
)
TOOLS = [
    {
        "name": name,
        "description": f"{name.replace('_', ' ')} in the repository",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
    for name in ("read_file", "run_tests", "grep")
]


# --- the caching stand-in -----------------------------------------------------------------------


@dataclass
class Bill:
    """What the stand-in served and charged."""

    calls: int = 0
    refused: int = 0
    input_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output_tokens: int = 0
    # Per served call: (input, cache read, cache write, output) tokens. Priced by the parent,
    # which runs the current tree (a child may run an older one, without the pricing module).
    per_call: list[tuple[int, int, int, int]] = field(default_factory=list)
    forwarded: list[list[str]] = field(default_factory=list)


class CachingProvider:
    """Anthropic Messages with prompt caching, on a simulated clock."""

    def __init__(self) -> None:
        from sessions_app.tokens import load_encoding

        # The encoding installed from PyPI (no download), as the ledger loads it.
        self._encoding = load_encoding("cl100k_base")
        self._token_memo: dict[str, int] = {}
        self._cache: dict[str, float] = {}  # prefix hash → expiry (simulated seconds)
        self._lock = threading.Lock()
        self.now = 0.0
        self.bill = Bill()
        self._server: ThreadingHTTPServer | None = None

    # The cache ----------------------------------------------------------------------------

    def reset(self) -> None:
        with self._lock:
            self._cache.clear()
            self.bill = Bill()
            self.now = 0.0

    def _tokens(self, text: str) -> int:
        found = self._token_memo.get(text)
        if found is None:
            found = self._token_memo[text] = len(self._encoding.encode(text, disallowed_special=()))
        return found

    @staticmethod
    def blocks(body: dict[str, Any]) -> list[tuple[str, bool]]:
        """The request as Anthropic caches it: tools, then system, then messages, one entry
        per block (its canonical JSON without `cache_control`, and whether it carries one)."""
        out: list[tuple[str, bool]] = []

        def add(where: str, block: Any) -> None:
            marked = isinstance(block, dict) and "cache_control" in block
            plain = (
                {k: v for k, v in block.items() if k != "cache_control"}
                if isinstance(block, dict)
                else block
            )
            out.append((where + json.dumps(plain, sort_keys=True, separators=(",", ":")), marked))

        for tool in body.get("tools") or []:
            add("tool:", tool)
        system = body.get("system")
        if isinstance(system, str):
            add("system:", {"type": "text", "text": system})
        elif isinstance(system, list):
            for block in system:
                add("system:", block)
        for message in body.get("messages") or []:
            content = message.get("content")
            if isinstance(content, str):
                add(message["role"] + ":", {"type": "text", "text": content})
            else:
                for block in content or []:
                    add(message["role"] + ":", block)
        return out

    def serve(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        blocks = self.blocks(body)
        breakpoints = [i for i, (_, marked) in enumerate(blocks) if marked]
        if len(breakpoints) > MAX_BREAKPOINTS:
            return 400, _error(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control")
        hashes: list[str] = []
        cumulative: list[int] = []
        digest = hashlib.blake2b(digest_size=16)
        total = 0
        for text, _ in blocks:
            digest.update(text.encode())
            hashes.append(digest.copy().hexdigest())
            total += self._tokens(text) + 1
            cumulative.append(total)
        with self._lock:
            if total > WINDOW:
                self.bill.refused += 1
                return 400, _error(f"prompt is too long: {total} tokens > {WINDOW} maximum")
            now = self.now
            self._cache = {h: t for h, t in self._cache.items() if t > now}
            read = 0
            hit: str | None = None
            for point in breakpoints:
                for index in range(point, max(point - LOOKBACK_BLOCKS, -1), -1):
                    if hashes[index] in self._cache and cumulative[index] > read:
                        read, hit = cumulative[index], hashes[index]
                        break
            if hit is not None:
                self._cache[hit] = now + CACHE_TTL
            write = 0
            for point in breakpoints:
                if cumulative[point] >= CACHE_MIN_TOKENS and cumulative[point] > read:
                    self._cache[hashes[point]] = now + CACHE_TTL
                    write = max(write, cumulative[point] - read)
            output = 60
            bill = self.bill
            bill.calls += 1
            bill.input_tokens += total
            bill.cache_read += read
            bill.cache_write += write
            bill.output_tokens += output
            bill.per_call.append((total, read, write, output))
            bill.forwarded.append([text for text, _ in blocks])
        reply = _agent_reply(body)
        return 200, {
            "id": f"msg_{bill.calls}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", MODEL),
            "content": reply,
            "stop_reason": "tool_use" if reply[-1]["type"] == "tool_use" else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": total - read - write,
                "cache_creation_input_tokens": write,
                "cache_read_input_tokens": read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": write,
                    "ephemeral_1h_input_tokens": 0,
                },
                "output_tokens": output,
            },
        }

    # HTTP ---------------------------------------------------------------------------------

    def start(self) -> str:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, payload = provider.serve(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _price(per_call: list[tuple[int, int, int, int]]) -> int:
    """The stand-in's bill in nanodollars: every call priced with genai-prices through the
    current tree's sessions_app.pricing (pure: no Django needed in the parent)."""
    from sessions_app.pricing import CallUsage, price_call

    total_nano = 0
    for total, read, write, output in per_call:
        price = price_call(
            MODEL,
            CallUsage(
                input_tokens=total,
                output_tokens=output,
                cached_input_tokens=read,
                cache_write_tokens=write,
            ),
        )
        assert price.nano_usd is not None, price.reason
        total_nano += price.nano_usd
    return total_nano


def _error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def _agent_reply(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's turn: up to TOOLS_PER_TASK tool calls after a task, then an answer. Read
    from the last message alone (fitting always keeps it): a tool result's id says which
    call of the task it answered."""
    last = (body.get("messages") or [{}])[-1]
    content = last.get("content")
    done = 0
    task = "t0"
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                task, _, number = str(block.get("tool_use_id", "t0-0")).rpartition("-")
                done = int(number or 0)
            elif isinstance(block, dict) and block.get("type") == "text":
                task = "t" + hashlib.blake2b(block["text"].encode(), digest_size=4).hexdigest()
    elif isinstance(content, str):
        task = "t" + hashlib.blake2b(content.encode(), digest_size=4).hexdigest()
    if done >= TOOLS_PER_TASK:
        return [{"type": "text", "text": f"Done with {task}: the tests pass after the fix."}]
    tool = TOOLS[done % len(TOOLS)]["name"]
    return [
        {"type": "text", "text": f"Step {done + 1}: I will {tool.replace('_', ' ')}."},
        {
            "type": "tool_use",
            "id": f"{task}-{done + 1}",
            "name": tool,
            "input": {"path": f"src/module_{task}_{done}.py"},
        },
    ]


# --- the client -------------------------------------------------------------------------------


def _file_text(call: int) -> str:
    """A tool result about 700 tokens long, different on every call."""
    return "\n".join(
        f"def handler_{call}_{line}(config):\n"
        f"    value = config.get('key_{line}', {call * 31 + line})\n"
        f"    return value * {line + 1}"
        for line in range(26)
    )


def _with_tail_marker(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as an agent sends it: one cache breakpoint on the newest block (the
    system prompt carries the other), moved forward on every call."""
    out = []
    for number, message in enumerate(history):
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
        if number == len(history) - 1:
            blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
        out.append({"role": message["role"], "content": blocks})
    return out


def _conversation(
    provider: CachingProvider, url: str, headers: dict[str, str], calls: int
) -> dict[str, Any]:
    import httpx

    history: list[dict[str, Any]] = []
    task = 0
    pending: dict[str, Any] = {"role": "user", "content": "Task 0: fix the KeyError in module_0."}
    served = 0
    refusal = ""
    gateway_calls = 0
    with httpx.Client(timeout=120) as client:
        for call in range(calls):
            history.append(pending)
            body = {
                "model": MODEL,
                "max_tokens": 512,
                "system": [
                    {
                        "type": "text",
                        "text": SYSTEM_TEXT,
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
                "tools": TOOLS,
                "messages": _with_tail_marker(history),
            }
            provider.now = call * CALL_SECONDS
            response = client.post(url, json=body, headers=headers)
            gateway_calls += 1
            if response.status_code != 200:
                refusal = f"call {call + 1}: {response.status_code} " + response.text[:160]
                break
            served += 1
            reply = response.json()["content"]
            history.append({"role": "assistant", "content": reply})
            tool = next((b for b in reply if b["type"] == "tool_use"), None)
            if tool is not None:
                pending = {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": tool["id"],
                            "content": _file_text(call),
                        }
                    ],
                }
            else:
                task += 1
                pending = {
                    "role": "user",
                    "content": f"Task {task}: fix the KeyError in module_{task} as well.",
                }
    return {"served": served, "refusal": refusal, "attempted": gateway_calls}


def _prefix_stable(forwarded: list[list[str]]) -> tuple[int, int, int, int]:
    """(stable, pairs) over all consecutive calls, and (stable, pairs) from the first call
    whose request is not the previous one plus new turns (fitting started)."""
    stable = pairs = stable_after = pairs_after = 0
    started = False
    for before, after in zip(forwarded, forwarded[1:], strict=False):
        ok = after[: len(before)] == before
        pairs += 1
        stable += ok
        if not ok:
            started = True
        if started:
            pairs_after += 1
            stable_after += ok
    return stable, pairs, stable_after, pairs_after


# --- child ------------------------------------------------------------------------------------

MODES = {
    "a": "per-call pruning",
    "b": "block compaction",
    "c": "client alone (X-Ledger-Fit: off)",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(profile: str, calls: int, modes: str, code: Path) -> dict[str, Any]:
    """Run `modes` against the project checkout `code` (its Django, its gateway in daphne)
    and return each mode's raw figures; the parent prices and tabulates them."""
    code = code.resolve()
    sys.path.insert(0, str(code))
    os.chdir(code)
    if profile == "postgres" and not os.environ.get("DATABASE_URL", "").endswith(f"/{PG_DB}"):
        raise SystemExit(f"refusing to run: DATABASE_URL is not the {PG_DB} bench database")
    if profile == "embedded" and (os.environ.get("DATABASE_URL") or not os.environ.get("VAR_DIR")):
        raise SystemExit("refusing to run: the embedded bench needs a temporary VAR_DIR")
    import django

    django.setup()
    import httpx
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    import sessions_app
    from sessions_app.errors import LedgerError
    from sessions_app.models import Session
    from sessions_app.selectors import usage_for_session
    from sessions_app.services import session_create

    loaded_from = Path(sessions_app.__file__).resolve().parent.parent
    if loaded_from != code:
        raise SystemExit(f"refusing to run: Django's code came from {loaded_from}, not {code}")
    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(username="bench", password="bench-password")
    token = Token.objects.create(user=user).key
    provider = CachingProvider()
    upstream = provider.start()
    port = _free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    env = {**os.environ, "LEDGER_ANTHROPIC_UPSTREAM": upstream}
    command = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    server = subprocess.Popen(
        [sys.executable, *command], env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=log
    )
    results: dict[str, dict[str, Any]] = {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/gateway/openai/v1/models", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/gateway/anthropic/v1/messages"
        # No background compaction (no worker in the child) and no cooldown: the replay runs
        # far faster than an agent, and a wall-clock cooldown would change what fitting does.
        base = {"autoCompact": False, "cooldownSeconds": 0}
        for key in modes:
            settings = {**base, "fitTargetRatio": 0.5} if key == "b" else base
            provider.reset()
            seen = "this build's default fitting"
            try:
                session = session_create(
                    owner=user,
                    model=MODEL,
                    context_limit=WINDOW,
                    settings=settings,
                    title=f"bench-cache-{key}",
                )
                if "fitTargetRatio" in settings:
                    seen = f"fitTargetRatio {settings['fitTargetRatio']}"
            except LedgerError:
                # A build without fitTargetRatio: whatever fitting the gateway does there.
                plain = {k: v for k, v in settings.items() if k != "fitTargetRatio"}
                session = session_create(
                    owner=user,
                    model=MODEL,
                    context_limit=WINDOW,
                    settings=plain,
                    title=f"bench-cache-{key}",
                )
                seen = "no fitTargetRatio in this build: its own fitting"
            headers = {
                "x-api-key": "sk-bench",
                "anthropic-version": "2023-06-01",
                "X-Ledger-Key": token,
                "X-Ledger-Session": str(session.pk),
            }
            if key == "c":
                headers["X-Ledger-Fit"] = "off"
                seen = "no fitting"
            try:
                run = _conversation(provider, url, headers, calls)
            except Exception as exc:
                traceback.print_exc()
                results[key] = {"label": MODES[key], "failed": f"{exc}"[:300]}
                continue
            bill = provider.bill
            stable, pairs, stable_after, pairs_after = _prefix_stable(bill.forwarded)
            usage = usage_for_session(session=Session.objects.get(pk=session.pk))
            results[key] = {
                "label": MODES[key],
                "mode_seen": seen,
                "served": run["served"],
                "refusal": run["refusal"],
                "stable": stable,
                "pairs": pairs,
                "stable_after": stable_after,
                "pairs_after": pairs_after,
                "input": bill.input_tokens,
                "read": bill.cache_read,
                "write": bill.cache_write,
                "per_call": bill.per_call,
                "forwarded_blocks": [len(blocks) for blocks in bill.forwarded],
                # An older build's /usage has no cost: the check is then skipped.
                "ledger_usd": usage.get("costUsd", "absent"),
            }
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        provider.close()
        log.seek(0)
        tracebacks = log.read().decode("utf-8", "replace").count("Traceback")
        log.close()
    return {"results": results, "tracebacks": tracebacks, "code": str(code)}


# --- parent -----------------------------------------------------------------------------------


def bill_table(results: dict[str, dict[str, Any]], calls: int) -> str:
    lines = [
        "| mode | code | fitting seen | calls served | prefix-stable calls | cache hit rate "
        "| input tokens (read / written) | dollars |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(results):
        r = results[key]
        if "failed" in r:
            lines.append(f"| ({key}) {r['label']} | {r['code_label']} | failed: {r['failed']} |")
            continue
        lines.append(
            f"| ({key}) {r['label']} | {r['code_label']} | {r['mode_seen']} "
            f"| {r['served']}/{calls} "
            f"| {r['stable']}/{r['pairs']} ({r['stable_after']}/{r['pairs_after']} once fitting "
            f"started) | {100 * r['hit_rate']:.1f} % | {r['input']:,} ({r['read']:,} / "
            f"{r['write']:,}) | ${r['usd']:.4f} |"
        )
    return "\n".join(lines)


def _code_label(code: Path) -> str:
    """The commit a checkout is at, for the table (its directory if git cannot say)."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(code), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return str(code)
    dirty = subprocess.run(
        ["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout.strip()
    return sha + (" + changes" if dirty else "")


def _rows(profile: str, results: dict[str, dict[str, Any]], roots: dict[str, Path]) -> list[Row]:
    rows: list[Row] = []
    for key in sorted(results):
        r = results[key]
        label = f"({key}) {r['label']}"
        if "failed" in r:
            rows.append(_row(profile, label, f"failed: {r['failed']}", ok=False))
            continue
        rows.append(
            _row(
                profile,
                f"{label} [{r['code_label']}; {r['mode_seen']}]",
                f"{r['served']}/{r['calls']} calls served"
                + (f" ({r['refusal']})" if r["refusal"] else "")
                + f"; prefix-stable {r['stable']}/{r['pairs']} (since fitting started: "
                f"{r['stable_after']}/{r['pairs_after']}); hit rate {100 * r['hit_rate']:.1f} %; "
                f"{r['input']:,} input tokens ({r['read']:,} read, {r['write']:,} written); "
                f"${r['usd']:.4f}",
            )
        )
        if r["ledger_usd"] == "absent":
            rows.append(
                _row(profile, f"{label} the ledger's /usage costUsd", "absent in this build")
            )
        else:
            agrees = r["ledger_usd"] is not None and abs(r["ledger_usd"] - r["usd"]) <= 1e-6 * max(
                r["usd"], 1
            )
            rows.append(
                _row(
                    profile,
                    f"{label} the ledger's /usage costUsd equals the provider's bill",
                    f"${r['ledger_usd']} vs ${r['usd']:.6f}",
                    "equal",
                    agrees,
                )
            )
    a, b = results.get("a", {}), results.get("b", {})
    if a.get("usd") and "usd" in b:
        ratio = b["usd"] / a["usd"]
        # The comparison means something only when (a) ran a build without block compaction
        # (an older checkout, --root a=DIR) and (b) one with it.
        meaningful = roots["a"] != roots["b"] and b["mode_seen"].startswith("fitTargetRatio")
        rows.append(
            _row(
                profile,
                "(b) block compaction's cost ÷ (a) per-call pruning's"
                + ("" if meaningful else " (a ran the same build as b: not compared)"),
                f"{100 * ratio:.1f} %",
                f"≤ {100 * TARGET_RATIO:.0f} %",
                ratio <= TARGET_RATIO if meaningful else None,
            )
        )
    return rows


def _parse_roots(values: list[str]) -> dict[str, Path]:
    roots = {key: ROOT for key in MODES}
    for value in values:
        key, sep, path = value.partition("=")
        if not sep or key not in MODES or not Path(path).is_dir():
            raise SystemExit(f"--root takes MODE=DIR with MODE one of {''.join(MODES)}: {value!r}")
        roots[key] = Path(path).resolve()
    return roots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prompt-cache cost benchmark (issue 21).")
    parser.add_argument("--profile", choices=["embedded", "postgres", "both"], default="embedded")
    parser.add_argument("--calls", type=int, default=CALLS, help="calls in the conversation")
    parser.add_argument("--modes", default="".join(MODES), help="which modes to run (abc)")
    parser.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="MODE=DIR",
        help="run MODE against the project checkout DIR (its Django, its gateway), e.g. "
        "a=/tmp/ledger-da3277e for per-call pruning as an older commit did it; default: this tree",
    )
    parser.add_argument("--child", choices=["embedded", "postgres"], help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        emit([{"document": _child(args.child, args.calls, args.modes, args.code)}])
        return 0
    if any(key not in MODES for key in args.modes):
        parser.error(f"--modes: letters of {''.join(MODES)}")
    roots = _parse_roots(args.root)
    profiles = ["embedded", "postgres"] if args.profile == "both" else [args.profile]
    load_before = load_average()
    started = time.perf_counter()
    rows: list[Row] = []
    for name in profiles:
        results: dict[str, dict[str, Any]] = {}
        # One child per checkout: each migrates its own throwaway database with its own code.
        groups: dict[Path, str] = {}
        for key in args.modes:
            groups[roots[key]] = groups.get(roots[key], "") + key
        for code, keys in groups.items():
            got = _run_cache_child(name, args.calls, keys, code)
            if "error" in got:
                rows.append(_row(name, f"modes {keys} on {code}", got["error"], ok=False))
                continue
            tracebacks = got["tracebacks"]
            rows.append(
                _row(
                    name,
                    f"tracebacks in daphne's log ({_code_label(code)})",
                    str(tracebacks),
                    "0",
                    not tracebacks,
                )
            )
            for key, r in got["results"].items():
                r["code_label"] = _code_label(code)
                r["calls"] = args.calls
                if "failed" not in r:
                    r["usd"] = _price(r.pop("per_call")) / 10**9
                    r["hit_rate"] = r["read"] / r["input"] if r["input"] else 0.0
                results[key] = r
        if results:
            print(f"{name}: a {args.calls}-call agent conversation, window {WINDOW:,} tokens\n")
            print(bill_table(results, args.calls) + "\n")
        rows = _rows(name, results, roots) + rows
    return report("Cache benchmark", rows, started=started, load_before=load_before)


def _run_cache_child(profile: str, calls: int, modes: str, code: Path) -> dict[str, Any]:
    """`run_child` for this bench: the child answers with one row holding its document."""
    got = run_child(
        script=__file__,
        profile=profile,
        args=["--calls", str(calls), "--modes", modes, "--code", str(code)],
        pg_db=PG_DB,
        timeout=3600,
        root=code,
    )
    if got and "document" in got[0]:
        return got[0]["document"]
    return {"error": got[0]["value"] if got else "no answer from the child"}


if __name__ == "__main__":
    raise SystemExit(main())
