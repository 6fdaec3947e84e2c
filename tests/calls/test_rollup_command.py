"""`manage.py rollup_calls` stores every closed window ahead of the first read, once."""

from __future__ import annotations

import datetime
import io
import random

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from sessions_app import call_rollup
from sessions_app.models import CallRollupBucket, CallRollupSpan
from sessions_app.services import session_create
from tests.calls.test_rollup_levels import _record

pytestmark = pytest.mark.django_db(transaction=True)


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("rollup_calls", *args, stdout=out)
    return out.getvalue()


def test_it_rolls_up_every_closed_window_since_the_oldest_call_once(alice):
    rng = random.Random(3)
    session = session_create(owner=alice, model="gpt-4o", title="calls")
    now = timezone.now()
    for _ in range(60):
        _record(session, now - datetime.timedelta(seconds=rng.uniform(0, 2 * 86400)), rng)
    assert not CallRollupBucket.objects.exists()
    first = _run()
    stored = CallRollupBucket.objects.count()
    # Every closed window from the oldest call's on (a closed window ends GRACE before now).
    assert stored >= 2 * 86400 // 900 - 2
    assert first.startswith(f"{stored} windows rolled up")
    # The whole day before yesterday's hours are built too.
    assert CallRollupSpan.objects.filter(level="hour").count() >= 24
    # Idempotent: nothing left to store.
    assert _run().startswith("0 windows rolled up")
    assert CallRollupBucket.objects.count() == stored
    # What a read then needs is stored: it rolls up nothing more.
    assert call_rollup.roll_up(since=now - datetime.timedelta(days=1), until=now) == 0


def test_it_says_so_when_there_is_nothing_to_roll_up_and_refuses_a_silly_range(alice):
    assert _run().startswith("No calls")
    with pytest.raises(CommandError):
        _run("--days", "0")
