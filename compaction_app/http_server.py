"""The HTTP server `manage.py serve` runs: daphne, with deadlines daphne does not have.

Daphne (through Twisted) reads a request's whole body before the application sees it, and
its only per-request limit (`--http-timeout`) starts when the body is complete and also cuts
long responses (a gateway stream), so it is not used. Twisted's idle timeout is reset by every
byte and defaults to 12 hours: a client sending its body a byte at a time held a connection
(and its buffer) open indefinitely, and 300 of them stayed open 40 s and more.

`LedgerServer` adds two deadlines:
- a request whose body has not fully arrived `HTTP_BODY_TIMEOUT_SECONDS` after its request
  line is answered 408 and its connection closed (checked every 2 s with daphne's own
  timeout loop, so it closes within that many seconds more);
- a connection idle for `HTTP_IDLE_TIMEOUT_SECONDS` (nothing sent, e.g. a keep-alive between
  requests, or no request line at all) is closed (Twisted's idle timeout, set on the factory).
Responses, streams and websockets are not limited here.

A request body of up to `BODY_IN_MEMORY` bytes is held in memory while it arrives and handed
to the application in one piece (`BODY_CHUNK`). Twisted writes any body over 100 kB to a
temporary file and daphne hands it over in 8 kB pieces, each a message through the
application's queue and a write into Django's buffer: a 1,600-message gateway call (0.27 MB)
made 34 of them and a file on disk, its cost growing with the conversation (issue 31, item 5).

Its access log never shows a provider key: Gemini's clients may put theirs in the query
(`?key=`), which daphne would print with the request's URI (`redacted`).
"""

from __future__ import annotations

import logging
import re
import time
from io import BytesIO
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from django.conf import settings

logger = logging.getLogger("compaction_app.http_server")

_TIMEOUT_BODY = b'{"error": "request_timeout", "detail": "the request body did not arrive in time"}'
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: "
    + str(len(_TIMEOUT_BODY)).encode()
    + b"\r\n\r\n"
    + _TIMEOUT_BODY
)


# A `key` query parameter (Gemini's API key in the URL), wherever it sits in the query.
_KEY_IN_QUERY = re.compile(r"([?&]key=)[^&#]*", re.IGNORECASE)


def redacted(uri: str) -> str:
    """A request's URI as the access log shows it: a key in the query replaced by `***`."""
    return _KEY_IN_QUERY.sub(r"\1***", uri) if "?" in uri else uri


# A body this large or smaller stays in memory while it arrives (Twisted's own bound is 100 kB,
# past which it writes a temporary file); the gateway reads bodies up to this size with orjson
# (gateway/body.py FAST_MAX_BYTES). Larger ones still go to a temporary file.
BODY_IN_MEMORY = 1 << 20
# The pieces a body is handed to the application in (daphne's default: 8 kB): such a body in
# one. Every piece is queued at once either way, so a larger body costs no more memory.
BODY_CHUNK = BODY_IN_MEMORY


class LedgerRequest(WebRequest):
    def gotLength(self, length: int | None) -> None:
        if length is not None and length <= BODY_IN_MEMORY:
            self.content = BytesIO()
        else:
            super().gotLength(length)


class LedgerHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = LedgerRequest
        return protocol


class LedgerServer(Server):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_buffer_size = BODY_CHUNK

    def log_action(self, protocol: str, action: str, details: dict[str, Any]) -> None:
        if isinstance(details.get("path"), str):
            details = {**details, "path": redacted(details["path"])}
        super().log_action(protocol, action, details)

    def run(self) -> None:
        from twisted.internet import reactor

        # Before the first connection is accepted (the factory exists by then): the idle
        # timeout is copied into each channel when it is built.
        reactor.callWhenRunning(self._apply_deadlines)
        super().run()

    def timeout_checker(self) -> None:
        self._apply_deadlines()
        super().timeout_checker()  # daphne's own checks; it schedules the next round

    def _apply_deadlines(self) -> None:
        factory = getattr(self, "http_factory", None)
        if factory is not None:
            # Daphne builds its factory in run(); before the first connection, its requests
            # become LedgerRequest (bodies in memory up to BODY_IN_MEMORY).
            if type(factory) is HTTPFactory:
                factory.__class__ = LedgerHTTPFactory
            # Channels built from now on get it (Twisted copies it in buildProtocol).
            factory.timeOut = settings.HTTP_IDLE_TIMEOUT_SECONDS
        deadline = settings.HTTP_BODY_TIMEOUT_SECONDS
        now = time.time()
        for protocol, details in list(self.connections.items()):
            if not isinstance(protocol, WebRequest) or hasattr(protocol, "request_start"):
                continue  # a websocket, or a request whose body is complete
            if details.get("disconnected") or now - details["connected"] <= deadline:
                continue
            logger.warning(
                "request body from %s not complete after %ss: closed (408)",
                protocol.client_addr or "?",
                deadline,
            )
            transport = protocol.channel.transport if protocol.channel else None
            if transport is not None:
                transport.write(_REQUEST_TIMEOUT)
                transport.loseConnection()
            # Not handed to the application: leave daphne's bookkeeping nothing to wait for.
            details["disconnected"] = now


class LedgerCommandLine(CommandLineInterface):
    server_class = LedgerServer


def run(*, host: str, port: int, extra: list[str] | None = None) -> Any:
    """Serve the project's ASGI application with daphne and the deadlines above."""
    return LedgerCommandLine().run(
        ["-b", host, "-p", str(port), *(extra or []), "config.asgi:application"]
    )
