"""`manage.py mcp`: the same MCP server over stdio, launched by the official client."""

from __future__ import annotations

import anyio
import pytest
from django.core.management import CommandError, call_command
from mcp import Client

from tests.support.gateway_live import token_for
from tests.support.mcp_live import payload, run, stdio_server_parameters


@pytest.mark.django_db(transaction=True)
def test_it_answers_the_same_tools_over_stdio_as_over_http(live_url, alice):
    async def over_http(client):
        return await client.list_tools()

    http_tools = run(live_url, token_for(alice), over_http).tools

    async def over_stdio(parameters):
        async with Client(parameters) as client:
            tools = await client.list_tools()
            sessions = await client.call_tool("ledger_sessions", {})
            usage = await client.call_tool("ledger_usage", {})
            return tools, sessions, usage

    with stdio_server_parameters() as parameters:
        tools, sessions, usage = anyio.run(over_stdio, parameters)
    assert [t.model_dump() for t in tools.tools] == [t.model_dump() for t in http_tools]
    # Calls are made as the token's owner (a fresh user: no sessions yet).
    assert payload(sessions) == {"sessions": []}
    assert usage.is_error
    assert payload(usage)["detail"] == "you have no sessions yet"


@pytest.mark.django_db
def test_it_refuses_to_start_without_a_valid_token(monkeypatch):
    monkeypatch.delenv("LEDGER_TOKEN", raising=False)
    with pytest.raises(CommandError, match="an API token is required"):
        call_command("mcp")
    with pytest.raises(CommandError, match="Invalid token"):
        call_command("mcp", token="not-a-token")
