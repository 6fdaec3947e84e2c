"""`manage.py serve`: the demo user exists only on the embedded profile or when asked for."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def _serve(*args: str) -> str:
    out = io.StringIO()
    call_command("serve", "--check", *args, stdout=out)
    return out.getvalue()


def test_it_creates_the_demo_user_on_the_embedded_profile(settings):
    settings.DATABASE_URL = ""
    settings.REDIS_URL = ""
    output = _serve()
    assert get_user_model().objects.filter(username="demo", is_staff=True).exists()
    assert "Demo user: demo / demo" in output


@pytest.mark.parametrize(
    "variables",
    [
        {"DATABASE_URL": "postgres://ledger@db.invalid/ledger", "REDIS_URL": ""},
        {"DATABASE_URL": "", "REDIS_URL": "redis://redis.invalid:6379/0"},
    ],
)
def test_it_starts_the_production_profile_with_no_known_credentials(settings, variables):
    for name, value in variables.items():
        setattr(settings, name, value)
    output = _serve()
    assert not get_user_model().objects.filter(username="demo").exists()
    assert "Demo user" not in output and "Authorization: Token" not in output
    assert "createsuperuser" in output


def test_it_creates_the_demo_user_in_production_only_when_asked(settings):
    settings.DATABASE_URL = "postgres://ledger@db.invalid/ledger"
    output = _serve("--demo-user")
    user = get_user_model().objects.get(username="demo")
    assert user.check_password("demo") and "API token" in output


def test_it_fails_on_a_busy_port_without_saying_it_serves():
    import socket

    from django.core.management.base import CommandError

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        out = io.StringIO()
        with pytest.raises(CommandError) as refused:
            call_command(
                "serve", "--port", str(port), "--no-demo-user", stdout=out, stderr=io.StringIO()
            )
    assert f"127.0.0.1:{port}" in str(refused.value) and "--port" in str(refused.value)
    assert "Serving on" not in out.getvalue()


def _child(*argv: str):
    """A sleeping Python whose command line ends with `argv`, once the system shows it so."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv])
    cmdline = Path(f"/proc/{child.pid}/cmdline")
    deadline = time.monotonic() + 5
    while cmdline.exists() and argv[-1].encode() not in cmdline.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return child


def test_it_stops_the_server_its_pid_file_names(tmp_path):
    from compaction_app.management.commands.serve import stop_previous

    server = _child("manage.py", "serve")  # a process that reads as a `serve`
    pids = tmp_path / "serve.pid"
    pids.write_text(f"{server.pid}\n")
    try:
        assert stop_previous(pids) == f"Stopped the server (pid {server.pid})."
        assert server.wait(timeout=5) is not None
        assert not pids.exists()
    finally:
        server.kill()
        server.wait()


def test_it_stops_nothing_without_a_server_of_its_own(tmp_path):
    from compaction_app.management.commands.serve import stop_previous

    pids = tmp_path / "serve.pid"
    assert stop_previous(pids) == "No server of this checkout is running."
    # A pid the system gave to another program since: left alone, the stale file removed.
    other = _child("not-the-ledger")
    try:
        pids.write_text(f"{other.pid}\n")
        assert stop_previous(pids) == "No server of this checkout is running."
        assert other.poll() is None and not pids.exists()
    finally:
        other.kill()
        other.wait()
