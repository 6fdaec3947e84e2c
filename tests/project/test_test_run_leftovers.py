"""A passing test run leaves nothing in VAR_DIR: Django removes the embedded profile's test
database, and tests/conftest.py the WAL companions (`-wal`, `-shm`) a server thread's
connection left beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.profile_independent

ROOT = Path(__file__).resolve().parents[2]
# A gateway call served by a live server thread: its connection outlives the test database.
LIVE_SERVER_TEST = (
    "tests/gateway/test_gateway_stream.py::test_it_relays_anthropic_events_and_records_the_reply"
)
_STRIPPED = ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "CHANNELS_PREFIX", "PYTEST_")


def test_it_leaves_no_test_database_files_behind(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED)}
    env.update(VAR_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", LIVE_SERVER_TEST, "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == []
