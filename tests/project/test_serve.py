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
