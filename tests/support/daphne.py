"""A daphne process of a test's own, serving config.asgi with the environment the test gives
(its database, channel prefix, limits): for what only a real server shows (HTTP framing, the
production channel layer)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.helpers import closed_port, drain_output, stop_process, wait_listening

ROOT = Path(__file__).resolve().parents[2]


def production_env(**extra: str) -> dict[str, str]:
    """This process's environment for a daphne on this test run's PostgreSQL database, Redis,
    channel prefix, queue and secret (the production profile), plus `extra`."""
    from django.conf import settings
    from django.db import connection

    database = connection.settings_dict
    return dict(
        os.environ,
        DATABASE_URL=(
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/"
            f"{database['NAME']}"
        ),
        REDIS_URL=settings.REDIS_URL,
        CHANNELS_PREFIX=settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        CELERY_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE,
        DJANGO_SECRET_KEY=settings.SECRET_KEY,
        DB_POOL_MIN_SIZE="0",
        **extra,
    )


@contextmanager
def daphne_process(env: Mapping[str, str], *, start_seconds: float = 60) -> Iterator[int]:
    """Start daphne on a free port, wait until it accepts connections, yield the port; stop
    it afterwards (killed if it does not stop within 20 s)."""
    port = closed_port()
    command = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    server = subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(port, server, what="daphne", seconds=start_seconds)
        drain_output(server)
        yield port
    finally:
        stop_process(server, seconds=20)
