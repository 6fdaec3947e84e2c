"""Helpers for the MCP tests: the official `mcp` client over Streamable HTTP (or stdio), driven
from sync tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


@asynccontextmanager
async def http_client(
    base_url: str, token: str | None, *, scheme: str = "Token", mode: str = "auto"
):
    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    async with create_mcp_http_client(headers=headers) as http:
        transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


def run(
    base_url: str, token: str | None, body: Callable[[Any], Awaitable[Any]], **options: Any
) -> Any:
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


# --- stdio: `manage.py mcp` in a child process -------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# As tests/live_ledger.py: the child runs the embedded profile on its own SQLite file, whatever
# profile the test run uses (the parent's test database is not one a child can open).
_STRIPPED = ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "CHANNELS_PREFIX", "EMBEDDED_WORKER")


@contextmanager
def stdio_server_parameters() -> Iterator[StdioServerParameters]:
    """`manage.py mcp` as a client launches it: a migrated database with alice, whose API
    token is in LEDGER_TOKEN."""
    with tempfile.TemporaryDirectory(prefix="mcp-stdio-") as var_dir:
        env = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
        env.update(VAR_DIR=var_dir, DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT))
        prepared = subprocess.run(
            [sys.executable, "-m", "tests.support.mcp_live"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        env["LEDGER_TOKEN"] = prepared.stdout.strip().splitlines()[-1]
        yield StdioServerParameters(
            command=sys.executable, args=["manage.py", "mcp"], env=env, cwd=str(ROOT)
        )


def _prepare() -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    call_command("migrate", interactive=False, verbosity=0)
    user = get_user_model().objects.create_user(username="alice", password="pw-alice")
    print(Token.objects.create(user=user).key, flush=True)


if __name__ == "__main__":
    _prepare()
