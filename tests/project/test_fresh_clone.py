"""The production profile from a fresh clone, as docs/operations.md starts it: `git clone` of this
tree's HEAD, then `manage.py serve` on PostgreSQL + Redis beside a second ASGI process (daphne)
and a separate `celery -A config worker`; a gateway call through one process and a compaction
through the other, its completion pushed over the websocket of the first.

The clone reuses this checkout's virtualenv (nothing is installed): PYTHONPATH names the clone,
so every process runs the clone's code, not this tree's. It gets a database of its own (created
and dropped here) and a Redis queue and channel prefix of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from compaction_app.testkit.provider_standin import ECHO, ProviderStandIn, Step

# Pure of this run's own database: the clone's processes use a database of their own, so this
# runs once in CI (the embedded run), whatever profile the run under it uses.
pytestmark = [pytest.mark.profile_independent, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
POSTGRES = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
REDIS = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
STARTUP_SECONDS = 90


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def services() -> None:
    if _reachable(POSTGRES, 5432) and _reachable(REDIS, 6379) and shutil.which("git"):
        return
    if os.environ.get("CI"):
        pytest.fail("the fresh-clone test needs PostgreSQL, Redis and git (CI has them)")
    pytest.skip("PostgreSQL, Redis or git is not available")


@contextlib.contextmanager
def _database() -> Iterator[str]:
    """A new, empty PostgreSQL database on the server POSTGRES names; its URL."""
    import psycopg

    name = f"ledger_clone_{os.getpid()}_{secrets.token_hex(3)}"
    admin = urlsplit(POSTGRES)._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlsplit(POSTGRES)._replace(path="/" + name).geturl()
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _clone(target: Path) -> Path:
    """`git clone` of this tree's committed HEAD (what a fresh checkout of it holds)."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    clone = target / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["git", "-C", str(clone), "checkout", "--quiet", "--detach", head],
        check=True,
        capture_output=True,
    )
    assert not (clone / "var").exists(), "a fresh clone has no var/"
    return clone


class Processes:
    def __init__(self, *, cwd: Path, env: dict[str, str], logs: Path) -> None:
        self.cwd, self.env, self.logs = cwd, env, logs
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append((name, process))
        return process

    def run(self, *argv: str) -> str:
        done = subprocess.run(
            list(argv), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def report(self) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)[-3000:]}" for name, _ in self.started)

    def wait(self, what: str, condition, seconds: float = STARTUP_SECONDS):
        deadline = time.monotonic() + seconds
        while True:
            value = condition()
            if value:
                return value
            for name, process in self.started:
                assert process.poll() is None, (
                    f"{name} exited while waiting for {what}\n{self.report()}"
                )
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.report()}"
            time.sleep(0.2)

    def listening(self, port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        for _, process in reversed(self.started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for _, process in self.started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, 9)
                process.wait()


def test_it_serves_the_production_profile_from_a_fresh_clone(services, tmp_path):
    import httpx
    import openai

    clone = _clone(tmp_path)
    http_port, second_port = _free_port(), _free_port()
    suffix = f"clone-{os.getpid()}-{secrets.token_hex(3)}"
    with _database() as database_url, ProviderStandIn(default=Step(text=ECHO)) as upstream:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DJANGO_", "PYTEST", "CELERY_", "CHANNELS_", "VAR_DIR"))
        }
        env.update(
            # Every process runs the clone's code (not this checkout's, which the venv's
            # editable install points at).
            PYTHONPATH=str(clone),
            DJANGO_SETTINGS_MODULE="config.settings",
            DATABASE_URL=database_url,
            REDIS_URL=REDIS,
            DJANGO_SECRET_KEY=secrets.token_urlsafe(40),
            CELERY_QUEUE=suffix,
            CHANNELS_PREFIX=suffix,
            API_THROTTLE_RATE="off",
            LEDGER_OPENAI_UPSTREAM=upstream.openai_url,
            LEDGER_ANTHROPIC_UPSTREAM=upstream.anthropic_url,
            LEDGER_GEMINI_UPSTREAM=upstream.gemini_url,
        )
        processes = Processes(cwd=clone, env=env, logs=tmp_path)
        python = str(VENV_BIN / "python")
        assert processes.run(
            python, "-c", "import compaction_app; print(compaction_app.__file__)"
        ).startswith(str(clone))
        try:
            # docs/operations.md: `manage.py serve` (it migrates), a second ASGI process and a
            # Celery worker; no `migrate` run before `serve`, as a newcomer would start it.
            processes.start(
                "serve", python, "manage.py", "serve", "--host", "127.0.0.1",
                "--port", str(http_port),
            )  # fmt: skip
            processes.wait("serve to listen", lambda: processes.listening(http_port))
            assert "Production profile: no demo user" in processes.log("serve")
            assert (clone / "var" / "serve.pid").read_text().strip().isdigit()
            processes.start(
                "daphne", str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(second_port),
                "config.asgi:application",
            )  # fmt: skip
            processes.start(
                "worker", str(VENV_BIN / "celery"), "-A", "config", "worker", "-l", "info",
                "--concurrency", "1", "--without-mingle", "--without-gossip",
            )  # fmt: skip
            # An account and its API token, with Django's own commands (the docs' way).
            processes.run(
                python, "manage.py", "shell", "-c",
                "from django.contrib.auth import get_user_model; "
                "get_user_model().objects.create_user('agent-1', password='pw-agent-1')",
            )  # fmt: skip
            token = processes.run(python, "manage.py", "drf_create_token", "agent-1").split()[2]
            processes.wait("daphne to listen", lambda: processes.listening(second_port))
            processes.wait("the worker", lambda: "ready." in processes.log("worker"))

            # A conversation through the gateway of the first process (the official SDK).
            client = openai.OpenAI(
                api_key="provider-key",
                base_url=f"http://127.0.0.1:{http_port}/gateway/openai/v1",
                default_headers={"X-Ledger-Key": token, "X-Ledger-Session": "fresh-clone"},
            )
            messages: list[dict[str, str]] = [{"role": "system", "content": "Be brief."}]
            session_id = ""
            for turn in range(4):
                messages.append({"role": "user", "content": f"Step {turn}: list files in src/"})
                raw = client.chat.completions.with_raw_response.create(
                    model="gpt-4o", messages=messages
                )
                reply = raw.parse()
                session_id = raw.headers["X-Ledger-Session"]
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            assert reply.choices[0].message.content.startswith("Re: Step 3")

            api = httpx.Client(
                base_url=f"http://127.0.0.1:{second_port}/api/v1",
                headers={"Authorization": f"Token {token}"},
                timeout=30,
            )
            # The calls ledger is written after each response: all four land.
            calls = processes.wait(
                "the calls",
                lambda: (
                    (body := api.get(f"/sessions/{session_id}/calls").json())["summary"]["calls"]
                    == 4
                    and body
                ),
                seconds=30,
            )
            assert {c["status"] for c in calls["results"]} == {"ok"}

            # A compaction through the second process, run by the separate worker, announced
            # over the first process's websocket (Redis carries it across).
            async def compact() -> tuple[dict, dict]:
                ws_url = f"ws://127.0.0.1:{http_port}/ws/sessions/{session_id}/?token={token}"
                import websockets

                async with websockets.connect(ws_url) as watcher:
                    created = await asyncio.to_thread(
                        lambda: api.post(
                            f"/sessions/{session_id}/compactions", json={"strategy": "summarize"}
                        )
                    )
                    assert created.status_code == 202, created.text
                    run_id = created.json()["id"]
                    async with asyncio.timeout(60):
                        while True:
                            message = json.loads(await watcher.recv())
                            if (
                                message.get("type") == "COMPACTION_COMPLETE"
                                and message.get("compactionId") == run_id
                            ):
                                return created.json(), message

            run, done = asyncio.run(compact())
            assert done["success"] is True, (done, processes.report())
            stored = api.get(f"/compactions/{run['id']}").json()
            assert (
                stored["status"] == "completed" and stored["eventsAfter"] < stored["eventsBefore"]
            )
            # The worker logs the task's end after the run's announcement went out: wait for it.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (
                "succeeded" in processes.log("worker") or run["id"] in processes.log("worker")
            ):
                time.sleep(0.2)
            assert "succeeded" in processes.log("worker") or run["id"] in processes.log("worker")
        finally:
            processes.stop()
        assert not (clone / "var" / "serve.pid").exists()
