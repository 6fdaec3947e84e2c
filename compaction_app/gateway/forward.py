"""Forwarding to the upstream provider: one pooled aiohttp session per event loop.

aiohttp rather than httpx (which the SDKs use): on the gateway's path the client's own
cost is paid on every provider call, and aiohttp's C parser spends about a quarter of
httpx's CPU per request (0.3 against 1.3 ms measured here on the stand-in). Views see an
`UpstreamResponse` and `UpstreamError`, nothing of the client library.

The provider credential travels in the forwarded headers only: it is never logged, stored or
put in an error message.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
from django.conf import settings

# Not forwarded: hop-by-hop headers, the body framing the HTTP client sets itself, the browser's
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

_sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}


# A body is handed to the HTTP client in pieces of this size (see Body)...
PIECE_BYTES = 1 << 16
# ... unless it is kept as bytes and at most this large: then whole (Body.whole).
WHOLE_MAX_BYTES = 1 << 20


class Body:
    """A request body to send upstream: its exact bytes, produced piece by piece.

    Given a large body whole, the HTTP client writes it to the socket in one call and the
    transport copies whatever the socket did not take at once: most of a 30 MB body. Pieces
    are written one at a time, each after the previous one drained. A body kept as text (the
    gateway keeps the client's body as its decoded text, see views._read_json) is encoded one
    piece at a time: UTF-8 encodes a text's pieces to exactly the pieces of its encoding
    (surrogatepass: a lone surrogate json.loads(bytes) let through goes back as it came)."""

    def __init__(self, data: bytes | str, *, length: int | None = None, prefix: bytes = b""):
        self._data = data
        self._prefix = prefix
        if length is None:
            length = len(prefix) + (
                len(data)
                if isinstance(data, bytes) or data.isascii()
                else sum(len(piece) for piece in self._text_pieces(data))
            )
        self.length = length

    def whole(self) -> bytes | None:
        """The body as one bytes object when it is kept as bytes and small enough for the
        HTTP client to write at once (a copy of what the socket does not take is cheap there;
        the pieces cost a loop round trip each)."""
        data = self._data
        if isinstance(data, bytes) and not self._prefix and len(data) <= WHOLE_MAX_BYTES:
            return data
        return None

    def pieces(self) -> Iterator[bytes]:
        if self._prefix:
            yield self._prefix
        data = self._data
        if isinstance(data, str):
            yield from self._text_pieces(data)
        else:
            for start in range(0, len(data), PIECE_BYTES):
                yield data[start : start + PIECE_BYTES]

    @staticmethod
    def _text_pieces(text: str) -> Iterator[bytes]:
        # Characters, not bytes: a piece of text encodes to at most 4 bytes a character.
        for start in range(0, len(text), PIECE_BYTES):
            yield text[start : start + PIECE_BYTES].encode("utf-8", "surrogatepass")


async def _stream(body: Body) -> AsyncIterator[bytes]:
    for piece in body.pieces():
        yield piece


class UpstreamError(Exception):
    """The upstream could not be reached, timed out, or broke off its answer."""


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    found = _sessions.get(loop)
    if found is None or found.closed:
        found = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=200, limit_per_host=0),
            # The body is relayed as the provider sent it, streamed or not (gzip included:
            # the request asks for identity, and a provider that compresses anyway is
            # decoded, as its encoding header is not passed on).
            auto_decompress=True,
            # No cookie jar: the gateway is not the provider's browser.
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",),
        )
        _sessions[loop] = found
    return found


async def close_sessions() -> None:
    """Close this event loop's upstream session (a server's loop ending: the tests' daphne)."""
    found = _sessions.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close()


class UpstreamResponse:
    """The upstream's answer once its headers arrived; the body is read by the caller."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.headers: Mapping[str, str] = response.headers

    async def aread(self) -> bytes:
        try:
            return await self._response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(exc.__class__.__name__) from exc

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(exc.__class__.__name__) from exc

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()  # the connection goes back to the pool
        else:
            self._response.close()  # a body left unread: the connection cannot be reused


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {
        name: value
        for name, value in headers.items()
        if name.lower() not in _DROPPED and not name.lower().startswith("x-ledger-")
    }
    # Uncompressed, so streamed chunks can be read as they are relayed.
    out["accept-encoding"] = "identity"
    if not any(name.lower() == "content-type" for name in out):
        # The body is JSON (the gateway parsed it); left unset, aiohttp would say octet-stream.
        out["content-type"] = "application/json"
    return out


def returned_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in headers.items()
        if name.lower() in _RETURNED or name.lower().startswith(_RETURNED_PREFIXES)
    }


def is_retryable_status(status: int) -> bool:
    """Statuses that move on to the next fallback model."""
    return status == 429 or status >= 500


async def send(
    *, url: str, headers: dict[str, str], content: bytes | Body, method: str = "POST"
) -> UpstreamResponse:
    """Send (POST unless told) and return once the response headers arrived (the body is read
    by the caller, streamed or not). Raises UpstreamError on connection errors and timeouts."""
    timeout = float(settings.LEDGER_UPSTREAM_TIMEOUT_SECONDS)
    if isinstance(content, bytes) and len(content) > PIECE_BYTES:
        content = Body(content)
    data: Any = content or None
    if isinstance(content, Body):
        whole = content.whole()
        if whole is not None:
            data = whole or None
        else:
            # Its exact length up front: the pieces go out as a plain body, not chunked.
            headers = {**headers, "content-length": str(content.length)}
            data = _stream(content) if content.length else None
    try:
        response = await _session().request(
            method,
            url,
            data=data,
            headers=headers,
            allow_redirects=False,
            # As before with httpx: each read may wait `timeout`, connecting at most 10 s.
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=min(timeout, 10.0), sock_read=timeout
            ),
        )
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise UpstreamError(exc.__class__.__name__) from exc
    return UpstreamResponse(response)
