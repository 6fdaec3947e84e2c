"""Failed logins are throttled per username and per client address, on the dashboard's and
the admin's login forms; the log names the username, never the password."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"


def _login(client: Client, username: str, password: str, path: str = LOGIN) -> int:
    return client.post(path, {"username": username, "password": password}).status_code


def test_it_locks_a_username_out_after_repeated_failures(alice, settings, caplog):
    settings.LOGIN_THROTTLE_USERNAME_FAILURES = 10
    caplog.set_level(logging.WARNING)
    statuses = [_login(Client(REMOTE_ADDR=f"10.0.0.{n}"), "alice", f"wrong-{n}") for n in range(25)]
    assert statuses[:10] == [200] * 10  # the form again, with its error
    assert set(statuses[10:]) == {429}
    # Locked: even the right password, from a new address, is refused until the window ends.
    response = Client(REMOTE_ADDR="10.0.1.1").post(
        LOGIN, {"username": "ALICE", "password": "pw-alice"}
    )
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert b"Too many failed login attempts" in response.content
    text = caplog.text
    assert "alice" in text and "failed login" in text
    assert "wrong-" not in text and "pw-alice" not in text


def test_it_locks_an_address_out_across_usernames(alice, bob, settings):
    settings.LOGIN_THROTTLE_ADDRESS_FAILURES = 5
    attacker = Client(REMOTE_ADDR="203.0.113.9")
    statuses = [_login(attacker, f"user{n}", "guess") for n in range(8)]
    assert statuses == [200] * 5 + [429] * 3
    assert _login(attacker, "bob", "pw-bob") == 429
    # Another address is not affected.
    assert _login(Client(REMOTE_ADDR="198.51.100.7"), "bob", "pw-bob") == 302


def test_it_throttles_the_admin_login_too(staff, settings):
    settings.LOGIN_THROTTLE_USERNAME_FAILURES = 3
    statuses = [
        _login(Client(REMOTE_ADDR=f"10.1.0.{n}"), "staff", "nope", "/admin/login/")
        for n in range(4)
    ]
    assert statuses == [200, 200, 200, 429]


def test_it_forgets_a_usernames_failures_after_a_successful_login(alice, settings):
    settings.LOGIN_THROTTLE_USERNAME_FAILURES = 3
    client = Client(REMOTE_ADDR="10.2.0.1")
    assert [_login(client, "alice", "no") for _ in range(2)] == [200, 200]
    assert _login(client, "alice", "pw-alice") == 302
    client.logout()
    assert [_login(client, "alice", "no") for _ in range(2)] == [200, 200]
    assert _login(client, "alice", "pw-alice") == 302


@pytest.mark.django_db(transaction=True)
def test_it_throttles_logins_served_over_asgi(alice, settings):
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    settings.LOGIN_THROTTLE_USERNAME_FAILURES = 3

    async def scenario() -> list[int]:
        client = AsyncClient(REMOTE_ADDR="10.3.0.1")
        statuses = []
        for password in ("a", "b", "c", "pw-alice"):
            response = await client.post(LOGIN, {"username": "alice", "password": password})
            statuses.append(response.status_code)
        return statuses

    assert async_to_sync(scenario)() == [200, 200, 200, 429]
