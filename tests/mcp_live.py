"""Helpers for the MCP tests: the official `mcp` client over Streamable HTTP (or stdio), driven
from sync tests."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


@asynccontextmanager
async def http_client(base_url: str, token: str | None, *, scheme: str = "Token", mode: str = "auto"):
    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    async with create_mcp_http_client(headers=headers) as http:
        transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


def run(base_url: str, token: str | None, body: Callable[[Any], Awaitable[Any]], **options: Any) -> Any:
    """Open a client, run `body(client)`, close it, return what body returned."""

    async def main() -> Any:
        async with http_client(base_url, token, **options) as client:
            return await body(client)

    return anyio.run(main)


def call(base_url: str, token: str, tool: str, **arguments: Any) -> Any:
    async def body(client: Any) -> Any:
        return await client.call_tool(tool, arguments)

    return run(base_url, token, body)


def payload(result: Any) -> dict[str, Any]:
    """A tool result's JSON (its text content)."""
    return json.loads(result.content[0].text)
