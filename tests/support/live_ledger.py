"""A live Context Ledger server in a child process, for clients that talk real HTTP and
websockets to it (the Python client, the LangGraph node's `ledger=` option).

The child runs the embedded profile (its own SQLite file in a temporary VAR_DIR, in-memory
channel layer, Celery worker thread), whatever profile the test run uses: daphne's Twisted
reactor cannot be restarted inside one process, and the browser tests already run one there.

`python -m tests.support.live_ledger PORT` migrates, creates alice, bob and staff with API tokens,
prints them as one JSON line, starts the worker thread and serves on 127.0.0.1:PORT.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.helpers import drain_output, stop_process, wait_listening

ROOT = Path(__file__).resolve().parents[2]
# The parent's production-profile variables must not reach the child: it would share (and
# migrate) the real database.
_STRIPPED = ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "CHANNELS_PREFIX", "EMBEDDED_WORKER")


@dataclass(frozen=True)
class LiveLedger:
    base_url: str
    tokens: dict[str, str]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def live_ledger(**env: str) -> Iterator[LiveLedger]:
    """Start the child server, wait until it answers, yield its URL and tokens, stop it."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="live-ledger-") as var_dir:
        child_env = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
        child_env.update(
            VAR_DIR=var_dir,
            DJANGO_SETTINGS_MODULE="config.settings",
            API_THROTTLE_RATE="off",
            PYTHONPATH=str(ROOT),
            **env,
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.live_ledger", str(port)],
            cwd=ROOT,
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("live ledger failed to start: " + process.stderr.read()[-3000:])
            tokens = json.loads(line)
            wait_listening(port, process, what="live ledger")
            drain_output(process)
            yield LiveLedger(base_url=f"http://127.0.0.1:{port}", tokens=tokens)
        finally:
            stop_process(process)


def _serve(port: int) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    call_command("migrate", interactive=False, verbosity=0)
    tokens = {}
    for name in ("alice", "bob", "staff"):
        user = get_user_model().objects.create_user(
            username=name, password="pw-" + name, is_staff=name == "staff"
        )
        tokens[name] = Token.objects.create(user=user).key
    print(json.dumps(tokens), flush=True)

    from daphne.cli import CommandLineInterface

    from compaction_app.embedded_worker import start_embedded_worker
    from config.celery import app

    start_embedded_worker(app)
    CommandLineInterface().run(["-b", "127.0.0.1", "-p", str(port), "config.asgi:application"])


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
