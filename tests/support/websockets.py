"""Websocket steps shared by the revocation and re-check tests (the sockets themselves come from
`helpers.ws_communicator`)."""

from __future__ import annotations

from typing import Any

from django.test import Client


async def open_socket(communicator: Any) -> None:
    """Connect and see a ping answered (the consumer is past its handshake)."""
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from(timeout=5) == {"type": "pong"}


async def closed_with(communicator: Any, *, timeout: float = 5) -> int | None:
    """The close code the server sends next, skipping other messages; fails after `timeout`
    seconds without one."""
    while True:
        output = await communicator.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return output.get("code")


async def still_open(communicator: Any) -> bool:
    await communicator.send_json_to({"type": "ping"})
    return await communicator.receive_json_from(timeout=5) == {"type": "pong"}


def login_cookie(username: str) -> tuple[Client, str]:
    """A browser logged in as `username` (password `pw-<username>`, as the user fixtures set),
    and its session cookie header value."""
    browser = Client()
    assert browser.login(username=username, password=f"pw-{username}")
    return browser, f"sessionid={browser.cookies['sessionid'].value}"
