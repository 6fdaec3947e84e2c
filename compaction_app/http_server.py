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
import resource
import sys
import time
from collections import OrderedDict
from io import BytesIO
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from django.conf import settings

from config.redact import redacted as _redacted

logger = logging.getLogger("compaction_app.http_server")

_TIMEOUT_BODY = b'{"error": "request_timeout", "detail": "the request body did not arrive in time"}'
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: "
    + str(len(_TIMEOUT_BODY)).encode()
    + b"\r\n\r\n"
    + _TIMEOUT_BODY
)


# A request's URI as the access log shows it: a `key` parameter's value (Gemini's API key in
# the URL, its `?` plain or percent-encoded) replaced by `***` (config/redact.py).
redacted = _redacted


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
    """Daphne's factory, with LedgerRequest and a bound on connections that hold nothing.

    A connection *waits* while no request of it is being handled: before its request line and
    headers are complete (and its body, which has its own deadline), and between keep-alive
    requests. Waiting costs the server a file descriptor and nothing costs the client: 20,800
    half-written request lines took daphne to its 20,000 descriptors, and legitimate calls
    failed while they were held (issue 42, row 9). So:
    - past `max_open` connections, the one that has waited longest is closed for each new
      one (a connection handling a request, a stream or a websocket is never closed here);
    - a connection waits at most `HTTP_IDLE_TIMEOUT_SECONDS` in one stretch, counted from
      when it connected or its last request ended: bytes trickling in do not reset it
      (Twisted's own idle timeout is reset by every byte).
    The factory's class is swapped in when the server starts (LedgerServer), so its state is
    made on first use."""

    def _open(self) -> OrderedDict[Any, float | None]:
        found = self.__dict__.get("_ledger_open")
        if found is None:
            found = self.__dict__["_ledger_open"] = OrderedDict()
        return found

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = LedgerRequest
        opened = self._open()
        opened[protocol] = time.monotonic()
        if len(opened) > max_open_connections():
            self._close_longest_waiting(len(opened) - max_open_connections(), spare=protocol)
        return protocol

    def _close_longest_waiting(self, count: int, *, spare: Any) -> None:
        opened = self._open()
        for protocol in list(opened):
            if count <= 0:
                return
            state = _state(protocol)
            if state == _GONE:
                del opened[protocol]
                count -= 1
            elif state == _WAITING and protocol is not spare:
                _abort(protocol)
                del opened[protocol]
                count -= 1

    def sweep(self, now: float, *, deadline: float) -> int:
        """Forget closed connections, note which wait since when, close those that waited
        past `deadline` seconds in one stretch; how many were closed."""
        opened = self._open()
        closed = 0
        for protocol, since in list(opened.items()):
            state = _state(protocol)
            if state in (_GONE, _UPGRADED):
                del opened[protocol]
            elif state == _BUSY:
                opened[protocol] = None
            elif since is None:
                opened[protocol] = now
            elif now - since > deadline:
                _abort(protocol)
                del opened[protocol]
                closed += 1
        return closed


_GONE, _UPGRADED, _BUSY, _WAITING = "gone", "upgraded", "busy", "waiting"


def _channel(protocol: Any) -> Any:
    # Twisted's factory builds a wrapper that negotiates HTTP/1.1 or HTTP/2 around the channel;
    # the channel holds the transport and the request state.
    return getattr(protocol, "_channel", protocol)


def _state(protocol: Any) -> str:
    transport = getattr(_channel(protocol), "transport", None)
    if transport is None:
        return _WAITING  # built, not connected yet
    if not getattr(transport, "connected", False) or getattr(transport, "disconnecting", False):
        return _GONE
    if getattr(transport, "protocol", protocol) not in (protocol, _channel(protocol)):
        return _UPGRADED  # handed to the websocket protocol (daphne's upgrade)
    return _BUSY if getattr(_channel(protocol), "_handlingRequest", False) else _WAITING


def _abort(protocol: Any) -> None:
    transport = getattr(_channel(protocol), "transport", None)
    if transport is not None:
        transport.abortConnection()


def max_open_connections() -> int:
    """HTTP_MAX_CONNECTIONS, and never more than half the process's file descriptors (the
    rest are for the connections that do work, the database's and Redis's)."""
    limit = int(settings.HTTP_MAX_CONNECTIONS)
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return limit
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(min(limit, soft // 2), 16)


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
            if isinstance(factory, LedgerHTTPFactory):
                closed = factory.sweep(
                    time.monotonic(), deadline=settings.HTTP_IDLE_TIMEOUT_SECONDS
                )
                if closed:
                    logger.warning(
                        "%s connection(s) closed: waiting for a request over %ss",
                        closed,
                        settings.HTTP_IDLE_TIMEOUT_SECONDS,
                    )
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


def harden_daphnes_command_line() -> None:
    """Under daphne's own command line (`daphne config.asgi:application`, the production
    profile's documented server), have it build LedgerServer: the same deadlines and the same
    access log without keys as `manage.py serve` (issue 42, rows 8 and 9). Daphne imports the
    application (config/asgi.py calls this) before it builds its server from
    `CommandLineInterface.server_class`; anywhere else this does nothing."""
    cli = sys.modules.get("daphne.cli")
    if cli is not None and cli.CommandLineInterface.server_class is Server:
        cli.CommandLineInterface.server_class = LedgerServer


def run(*, host: str, port: int, extra: list[str] | None = None) -> Any:
    """Serve the project's ASGI application with daphne and the deadlines above."""
    return LedgerCommandLine().run(
        ["-b", host, "-p", str(port), *(extra or []), "config.asgi:application"]
    )
