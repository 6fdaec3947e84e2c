"""Forwarding to the upstream provider: one pooled httpx.AsyncClient per event loop.

The provider credential travels in the forwarded headers only: it is never logged, stored or
put in an error message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx
from django.conf import settings

# Not forwarded: hop-by-hop headers, the body framing httpx sets itself, the browser's
# cookies, and the gateway's own headers.
_DROPPED = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "cookie",
        "accept-encoding",
    }
)
# Upstream response headers worth handing back (rate limits, request ids, retry hints).
_RETURNED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "openai-")
_RETURNED = frozenset({"retry-after", "x-request-id", "request-id", "retry-after-ms"})

_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}


def client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    found = _clients.get(loop)
    if found is None or found.is_closed:
        timeout = float(settings.LEDGER_UPSTREAM_TIMEOUT_SECONDS)
        found = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
            follow_redirects=False,
        )
        _clients[loop] = found
    return found


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {
        name: value
        for name, value in headers.items()
        if name.lower() not in _DROPPED and not name.lower().startswith("x-ledger-")
    }
    # Uncompressed, so streamed chunks can be read as they are relayed.
    out["accept-encoding"] = "identity"
    return out


def returned_headers(headers: httpx.Headers) -> dict[str, str]:
    return {
        name: value
        for name, value in headers.items()
        if name.lower() in _RETURNED or name.lower().startswith(_RETURNED_PREFIXES)
    }


def is_retryable_status(status: int) -> bool:
    """Statuses that move on to the next fallback model."""
    return status == 429 or status >= 500


async def send(*, url: str, headers: dict[str, str], content: bytes) -> httpx.Response:
    """POST and return once the response headers arrived (the body is read by the caller,
    streamed or not). Raises httpx.TransportError on connection errors and timeouts."""
    http = client()
    timeout = float(settings.LEDGER_UPSTREAM_TIMEOUT_SECONDS)
    request = http.build_request(
        "POST",
        url,
        headers=headers,
        content=content,
        timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
    )
    return await http.send(request, stream=True)
