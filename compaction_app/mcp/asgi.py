"""/mcp on the site's ASGI app: the SDK's Streamable HTTP transport, stateless, behind the
API's token auth.

Stateless: every POST is answered on its own (no `Mcp-Session-Id`, nothing kept between
requests), so any ASGI process of the production profile can answer any call. Responses are
plain JSON rather than an SSE stream: no tool streams progress.

Auth is checked from the headers alone, before the body is read: `Authorization: Token <key>`
(as the REST API) or `Bearer <key>` (what MCP clients send by default), with the API's
tokens. A refusal is REST's 401 body with `WWW-Authenticate: Token`.

The SDK's session manager needs a task group that outlives requests; daphne runs no ASGI
lifespan, so the manager is started on the first request of each event loop and kept.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from compaction_app.gateway import workers
from compaction_app.mcp.server import SCOPE_USER, build_server, rest_error

PATH = "/mcp"
SCHEMES = ("token", "bearer")

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def authenticate(header: str | None) -> Any:
    """The active user whose API token the Authorization header carries, or REST's error
    (status, body) for it."""
    scheme, _, key = (header or "").strip().partition(" ")
    try:
        if scheme.lower() not in SCHEMES:
            raise exceptions.NotAuthenticated()
        key = key.strip()
        if not key or " " in key:
            raise exceptions.AuthenticationFailed("Invalid token header.")
        user, _token = TokenAuthentication().authenticate_credentials(key)
        return user
    except exceptions.APIException as exc:
        return rest_error(exc)


async def _json(send: Any, status: int, body: dict[str, Any], headers: list[Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class McpApp:
    def __init__(self) -> None:
        self.server = build_server()
        self._managers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[StreamableHTTPSessionManager, asyncio.Event, Any]
        ] = weakref.WeakKeyDictionary()

    async def _manager(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        entry = self._managers.get(loop)
        if entry is None:
            manager = StreamableHTTPSessionManager(
                app=self.server,
                stateless=True,
                json_response=True,
                max_request_body_size=settings.API_MAX_BODY_BYTES,
            )
            ready = asyncio.Event()

            async def hold() -> None:
                async with manager.run():
                    ready.set()
                    await asyncio.Event().wait()

            # The task is kept with the manager: a task nobody references may be collected.
            entry = (manager, ready, loop.create_task(hold(), name="mcp-session-manager"))
            self._managers[loop] = entry
        await entry[1].wait()
        return entry[0]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = {key.lower(): value for key, value in scope.get("headers", [])}
        host = headers.get(b"host", b"").decode("latin-1")
        domain, _port = split_domain_port(host)
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            await _json(send, 400, {"error": "bad_request", "detail": "Invalid Host header."}, [])
            return
        raw = headers.get(b"authorization")
        outcome = await workers.run(authenticate, raw.decode("latin-1") if raw else None)
        if isinstance(outcome, tuple):
            status, body = outcome
            await _json(send, status, body, [(b"www-authenticate", b"Token")])
            return
        manager = await self._manager()
        await manager.handle_request({**scope, SCOPE_USER: outcome}, receive, send)


def with_mcp(site: ASGIApp, mcp: ASGIApp) -> ASGIApp:
    """An ASGI app that sends HTTP requests for /mcp to `mcp`, the rest to `site`."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if path in (PATH, PATH + "/"):
                await mcp(scope, receive, send)
                return
        await site(scope, receive, send)

    return app
