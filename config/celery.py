"""The Celery app. Configuration comes from Django settings (CELERY_* names)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("context_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def broker_is_process_local() -> bool:
    """Whether the broker lives in this process's memory (the embedded profile)."""
    return str(app.conf.broker_url or "").startswith("memory://")


@contextmanager
def tasks_inline_unless_broker_outlives_process() -> Iterator[bool]:
    """For commands: inside the block, a task sent to an in-memory broker runs right away in
    the sending thread. Such a broker dies with the command's process, so a task queued there
    would never run (a compaction would stay `pending`). With a real broker (Redis) tasks are
    queued as usual for the server's workers. Yields whether tasks run inline."""
    inline = broker_is_process_local()
    previous = app.conf.task_always_eager
    if inline:
        app.conf.task_always_eager = True
    try:
        yield inline
    finally:
        app.conf.task_always_eager = previous
