"""Large request bodies: one large event through the REST API, and one large Chat Completions
request through the gateway. Time and peak memory per request, as a multiple of the body.

    python bench/bench_large_event.py [--sizes 1,8,31] [--kinds rest,gateway] [--profile postgres]

Each row runs in its own child process (a fresh interpreter; the embedded profile's SQLite in
a throwaway directory, or with --profile postgres a fresh database on 127.0.0.1:5432) that
calls the site's own ASGI application (`config.asgi.application`,
what `manage.py serve` runs: the body-limit wrapper, Django's handler, the gateway's handler)
in process, the body arriving in daphne's 8 KiB messages:

- rest: `POST /api/v1/sessions/{id}/events` with one USER_MESSAGE of that many MB of
  prose-like text;
- gateway: `POST /gateway/openai/v1/chat/completions` with that many MB of conversation in
  messages of ~7 KB (30 MB ≈ 4,400 messages, as in issue 22), on a new session whose model's
  window holds it all (nothing is compacted: the call is recorded, counted and forwarded as
  sent), forwarded to the provider stand-in running in another process.

With --served the same requests go over HTTP to `manage.py serve` (daphne) in its own process
instead, one server per row, and the table gives the wall time and the server's resident
high-water mark over the request: what the process really holds, daphne's buffers included.

Each child first makes one small request of its kind (the tokenizer's vocabulary and the
imports are loaded once per process, not per request), then the measured one twice: once
plain (wall time, and the process's resident-memory high-water mark over the request, reset
just before it through /proc/self/clear_refs), once under tracemalloc (the peak of Python's
own allocations during the request). Target (issue 22, row 14): at most 3× the body, time
linear in the size. tracemalloc does not see SQLite's or the socket's buffers; the resident
figure does, and includes whatever the allocator keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from child_env import child_env  # noqa: E402
from harness import pg_admin  # noqa: E402

EVENTS_PATH = "/api/v1/sessions/{session}/events"
GATEWAY_PATH = "/gateway/openai/v1/chat/completions"
# A model of the stand-in whose window holds the largest request whole (see the docstring).
GATEWAY_MODEL = "bench-large-body"
PG_DB = "bench_large_event"
MESSAGE_BYTES = 7_000
DAPHNE_CHUNK = 8192  # daphne's request_buffer_size: the size of the body's ASGI messages


def _words(rng: random.Random) -> list[str]:
    return [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)
    ]


def prose(chars: int, rng: random.Random, words: list[str]) -> str:
    """About `chars` characters of one long line of word-like text."""
    return " ".join(rng.choices(words, k=chars // 6 + 1))[:chars]


def build_body(kind: str, megabytes: int) -> bytes:
    rng = random.Random(14)
    words = _words(rng)
    size = megabytes * 1_000_000
    if kind == "rest":
        return json.dumps({"type": "USER_MESSAGE", "content": prose(size, rng, words)}).encode()
    messages = [
        {
            "role": "user" if index % 2 == 0 else "assistant",
            "content": prose(MESSAGE_BYTES, rng, words),
        }
        for index in range(max(size // (MESSAGE_BYTES + 40), 1))
    ]
    return json.dumps({"model": GATEWAY_MODEL, "messages": messages}).encode()


# --- the child ------------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


async def _asgi_post(
    app: Any, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, bytes]:
    """POST `body` to the ASGI `app` as daphne hands it on; the answer's status and its first
    bytes (the rest is counted, not kept: a server writes it to the socket)."""
    import asyncio

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *((name.lower().encode(), value.encode()) for name, value in headers.items()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    position = 0
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal position
        if position < len(body) or position == 0:
            chunk = body[position : position + DAPHNE_CHUNK]
            position += DAPHNE_CHUNK
            return {"type": "http.request", "body": chunk, "more_body": position < len(body)}
        await done.wait()  # the handler listens for a disconnect until it has answered
        return {"type": "http.disconnect"}

    status = 0
    head = bytearray()

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and len(head) < 400:
            head.extend(message.get("body", b"")[: 400 - len(head)])

    await app(scope, receive, send)
    done.set()
    return status, bytes(head)


def child(kind: str, megabytes: int, body_file: str) -> dict[str, Any]:
    import asyncio
    import gc
    import tracemalloc

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from compaction_app.gateway import forward
    from config.asgi import application
    from sessions_app import receivers

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(username="alice")
    key = Token.objects.create(user=user).key
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")

    def target() -> tuple[str, dict[str, str]]:
        if kind == "rest":
            session = api.post(
                "/api/v1/sessions", {"model": "gpt-4o", "contextLimit": 100_000_000}, format="json"
            ).json()["id"]
            return EVENTS_PATH.format(session=session), {"authorization": f"Token {key}"}
        # A new gateway session per call: its own X-Ledger-Session.
        return GATEWAY_PATH, {
            "x-ledger-key": key,
            "x-ledger-session": f"bench-{time.monotonic_ns()}",
            "authorization": "Bearer sk-bench",
        }

    async def call(path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        try:
            return await _asgi_post(application, path, headers, body)
        finally:
            await forward.close_sessions()  # this loop's upstream connections

    def post(body: bytes) -> tuple[int, bytes]:
        path, headers = target()
        return asyncio.run(call(path, headers, body))

    def settle() -> None:
        # An append queues the search index's pass on a timer (sessions_app/receivers.py):
        # let it fire now, not inside the next measured request (the first one imports the
        # broker's transport).
        time.sleep(receivers.INDEX_DELAY_SECONDS + 0.5)

    small = build_body(kind, 0) if kind == "gateway" else b'{"type":"USER_MESSAGE","content":"hi"}'
    status, head = post(small)
    assert status in (200, 201), (status, head)
    settle()
    # What any request of this kind costs, whatever its size.
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    post(small)
    small_peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    settle()

    body = Path(body_file).read_bytes()
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from here
    resident = _status_kb("VmRSS")
    started = time.perf_counter()
    status, head = post(body)
    elapsed = time.perf_counter() - started
    resident_peak = (_status_kb("VmHWM") - resident) * 1024
    assert status in (200, 201), (status, head)
    settle()

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    status, head = post(body)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert status in (200, 201), (status, head)
    return {
        "kind": kind,
        "mb": megabytes,
        "body": len(body),
        "seconds": elapsed,
        "peak": peak,
        "resident": resident_peak,
        "small_body": len(small),
        "small_peak": small_peak,
    }


# --- the parent -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_child(
    kind: str, size: int, env: dict[str, str], work: Path, *, postgres: bool
) -> dict[str, Any]:
    body_file = work / f"{kind}-{size}.json"
    body_file.write_bytes(build_body(kind, size))
    var_dir = work / f"var-{kind}-{size}"
    var_dir.mkdir()
    env = {**env, "VAR_DIR": str(var_dir)}
    if postgres:
        pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        pg_admin(f"CREATE DATABASE {PG_DB}")
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{PG_DB}"
        env["DJANGO_SECRET_KEY"] = "bench"
    try:
        out = subprocess.run(  # noqa: S603 - this script, again
            [sys.executable, __file__, "--child", kind, str(size), str(body_file)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        body_file.unlink()
        if postgres:
            pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
    if out.returncode:
        raise SystemExit(f"{kind} {size} MB failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _http_post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request(
            "POST", path, body=body, headers={"Content-Type": "application/json", **headers}
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _served_row(
    kind: str, size: int, env: dict[str, str], work: Path, *, postgres: bool
) -> dict[str, Any]:
    """One request to `manage.py serve`: wall time and the server's resident peak."""
    var_dir = work / f"served-{kind}-{size}"
    var_dir.mkdir()
    env = {**env, "VAR_DIR": str(var_dir), "DJANGO_SECRET_KEY": "bench"}
    if postgres:
        pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        pg_admin(f"CREATE DATABASE {PG_DB}")
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{PG_DB}"
    manage = [sys.executable, "manage.py"]
    server = None
    try:
        subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)  # noqa: S603
        key = subprocess.run(  # noqa: S603
            [
                *manage,
                "shell",
                "-c",
                "from django.contrib.auth import get_user_model as users\n"
                "from rest_framework.authtoken.models import Token\n"
                "print(Token.objects.create(user=users().objects.create_user('alice')).key)",
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[-1]
        port = _free_port()
        server = subprocess.Popen(  # noqa: S603
            [*manage, "serve", "--no-demo-user", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.2)
        status_file = Path(f"/proc/{server.pid}/status")

        def resident(field: str) -> int:
            for line in status_file.read_text().splitlines():
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
            raise LookupError(field)

        def target() -> tuple[str, dict[str, str]]:
            if kind == "rest":
                status, answer = _http_post(
                    port,
                    "/api/v1/sessions",
                    json.dumps({"model": "gpt-4o", "contextLimit": 100_000_000}).encode(),
                    {"Authorization": f"Token {key}"},
                )
                session = json.loads(answer)["id"]
                return EVENTS_PATH.format(session=session), {"Authorization": f"Token {key}"}
            return GATEWAY_PATH, {
                "X-Ledger-Key": key,
                "X-Ledger-Session": f"bench-{time.monotonic_ns()}",
                "Authorization": "Bearer sk-bench",
            }

        small = (
            build_body(kind, 0) if kind == "gateway" else b'{"type":"USER_MESSAGE","content":"hi"}'
        )
        path, headers = target()
        status, answer = _http_post(port, path, small, headers)
        assert status in (200, 201), (status, answer[:300])
        body = build_body(kind, size)
        path, headers = target()
        time.sleep(2)  # the index timer of the warm-up fires (see child)
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")
        before = resident("VmRSS")
        started = time.perf_counter()
        status, answer = _http_post(port, path, body, headers)
        elapsed = time.perf_counter() - started
        time.sleep(1)
        assert status in (200, 201), (status, answer[:300])
        return {"body": len(body), "seconds": elapsed, "resident": resident("VmHWM") - before}
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        if postgres:
            pg_admin(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,31")
    parser.add_argument("--kinds", default="rest,gateway")
    parser.add_argument("--profile", choices=("embedded", "postgres"), default="embedded")
    parser.add_argument("--served", action="store_true", help="through manage.py serve")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "MB", "BODY_FILE"))
    args = parser.parse_args(argv)
    if args.child is not None:
        kind, size, body_file = args.child
        print(json.dumps(child(kind, int(size), body_file)))
        return 0
    kinds = args.kinds.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        env = child_env(var_dir=work)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["MODEL_CONTEXT_OVERRIDES"] = json.dumps({GATEWAY_MODEL: 100_000_000})
        standin = None
        if "gateway" in kinds:
            port = _free_port()
            standin = subprocess.Popen(  # noqa: S603 - the project's own stand-in
                [
                    sys.executable,
                    "-m",
                    "compaction_app.testkit.provider_standin",
                    "--port",
                    str(port),
                    "--reply",
                    "Noted.",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
            )
            env["LEDGER_OPENAI_UPSTREAM"] = f"http://127.0.0.1:{port}/v1"
            time.sleep(1.5)
        try:
            print(f"profile: {args.profile}{' (manage.py serve)' if args.served else ''}\n")
            if args.served:
                _served_table(kinds, sizes, env, work, postgres=args.profile == "postgres")
                return 0
            print(
                "| request | body | time | s/MB | Python peak | ÷ body | resident peak | ÷ body |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            fixed = []
            for kind in kinds:
                for size in sizes:
                    row = _run_child(kind, size, env, work, postgres=args.profile == "postgres")
                    if size == sizes[0]:
                        fixed.append(
                            f"{kind}: {row['small_peak'] / 1e6:.1f} MB "
                            f"(a {row['small_body'] / 1e3:.1f} kB body)"
                        )
                    mb = row["body"] / 1e6
                    print(
                        f"| {kind} | {mb:.1f} MB | {row['seconds']:.2f} s "
                        f"| {row['seconds'] / mb:.2f} | {row['peak'] / 1e6:.0f} MB "
                        f"| {row['peak'] / row['body']:.1f}× "
                        f"| {row['resident'] / 1e6:.0f} MB "
                        f"| {row['resident'] / row['body']:.1f}× |",
                        flush=True,
                    )
            print("\nPython peak of a small request, the cost of any request: " + "; ".join(fixed))
        finally:
            if standin is not None:
                standin.terminate()
                standin.wait(timeout=10)
    return 0


def _served_table(
    kinds: list[str], sizes: list[int], env: dict[str, str], work: Path, *, postgres: bool
) -> None:
    print("| request | body | time | s/MB | server's resident peak | ÷ body |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in kinds:
        for size in sizes:
            row = _served_row(kind, size, env, work, postgres=postgres)
            mb = row["body"] / 1e6
            print(
                f"| {kind} | {mb:.1f} MB | {row['seconds']:.2f} s | {row['seconds'] / mb:.2f} "
                f"| {row['resident'] / 1e6:.0f} MB | {row['resident'] / row['body']:.1f}× |",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
