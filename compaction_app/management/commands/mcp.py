"""`manage.py mcp`: the MCP server over stdio, for clients that only launch local servers.

manage.py mcp --token KEY        # every call is made as the owner of this API token
LEDGER_TOKEN=KEY manage.py mcp   # the same, the token from the environment

The tools, resources and errors are those of /mcp (compaction_app/mcp). stdout carries the
protocol alone; logs go to stderr.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from compaction_app.mcp.asgi import authenticate
from compaction_app.mcp.server import build_server

TOKEN_ENV = "LEDGER_TOKEN"


class Command(BaseCommand):
    help = "Serve the ledger's MCP tools and resources over stdio, as the owner of an API token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--token",
            default=None,
            help=f"the API token to act as (default: the {TOKEN_ENV} environment variable)",
        )

    def handle(self, *args: Any, token: str | None, **options: Any) -> None:
        key = token or os.environ.get(TOKEN_ENV, "")
        user = authenticate(f"Token {key}" if key else None)
        if isinstance(user, tuple):
            raise CommandError(
                f"an API token is required (--token or {TOKEN_ENV}): {user[1].get('detail')}"
            )
        if settings.EMBEDDED_WORKER:
            # The in-memory broker lives in this process: without a worker here a requested
            # compaction would never run.
            from compaction_app.embedded_worker import start_embedded_worker
            from config.celery import app

            start_embedded_worker(app)
        server = build_server(stdio_user=user)

        async def serve() -> None:
            from mcp.server.stdio import stdio_server

            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())

        anyio.run(serve)
