"""The gateway's async views, one handler per route kind (wire.py); none of them asks which
wire format it serves.

A conversation call goes prepare (validate; record and fit in one hop into the ORM's
threads) → forward (async, with failover) → respond (relay the answer, record the reply).
Every other path under a wire's prefix passes through to the provider as sent.

Errors the gateway produces itself are shaped like the provider's, so the official SDKs raise
their usual exception classes; that holds on every path under /gateway/, unknown ones
included.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import io
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from compaction_app.gateway import (
    after,
    budget,
    calls,
    forward,
    stream_limits,
    thread_fit,
    workers,
)
from compaction_app.gateway import (
    body as body_reader,
)
from compaction_app.gateway import wire as wire_kinds
from compaction_app.gateway.fit import Fitted
from compaction_app.gateway.messages import GatewayError, GatewayInputError, Reply
from compaction_app.gateway.prepare import Call, fit_call, prepare, seq_runs
from compaction_app.gateway.providers import PROVIDERS
from compaction_app.gateway.record import authenticate
from compaction_app.gateway.stream import MALFORMED, StreamEnding, relay
from compaction_app.gateway.wire import ParsedRequest, StreamAccumulator, Wire
from compaction_app.realtime import broadcast
from sessions_app import tokens
from sessions_app.api.parsers import (
    MAX_JSON_DEPTH,
    release_freed_memory,
    strict_loads,
)
from sessions_app.errors import TooManyRequests
from sessions_app.heavy import RETRY_AFTER_SECONDS, heavy_slot
from sessions_app.json_depth import nests_deeper
from sessions_app.models import ROLE_FOR_TYPE, CallStatus
from sessions_app.pricing import saved_tokens
from sessions_app.services import MAX_CONTEXT_LIMIT, model_registry
from sessions_app.storable import provider_loads

logger = logging.getLogger("compaction_app.gateway")

# Every wire format the gateway speaks: the providers' registry (providers/__init__.py).
WIRES: tuple[Wire, ...] = PROVIDERS

CONTEXT_LIMIT_HEADER = "X-Ledger-Context-Limit"

# Django types URL views as sync; an async view is a coroutine function all the same.
View = Callable[..., Any]


def _upstream_base(wire: Wire) -> str:
    return str(getattr(settings, wire.UPSTREAM_SETTING)).rstrip("/")


def _error(wire: Wire, exc: GatewayError, headers: dict[str, str] | None = None) -> JsonResponse:
    body = wire.error_body(
        exc.message, status=exc.status, code=exc.code, param=exc.param, **exc.extra
    )
    response = JsonResponse(body, status=exc.status)
    for name, value in {**exc.headers, **(headers or {})}.items():
        response[name] = value
    return response


def _refused(
    wire: Wire,
    trace: calls.Trace,
    exc: GatewayError,
    headers: dict[str, str] | None = None,
    *,
    status: str = CallStatus.REFUSED,
) -> JsonResponse:
    """The gateway's own error answer, noted as the call's ending."""
    trace.end(status, http_status=exc.status, code=exc.code or "", error=exc.message)
    return _error(wire, exc, headers)


def _upstream_failed(exc: forward.UpstreamError) -> str:
    return (
        CallStatus.TIMEOUT
        if isinstance(exc.__cause__, TimeoutError)
        else CallStatus.UPSTREAM_UNAVAILABLE
    )


def _method_not_allowed(wire: Wire, allowed: tuple[str, ...]) -> JsonResponse:
    response = _error(
        wire, GatewayError(f"use {' or '.join(allowed)}", status=405, code="method_not_allowed")
    )
    response["Allow"] = ", ".join(allowed)
    return response


# Recent bodies per conversation, so a call reads only what it adds (body.py). Read and kept
# on the event loop: reading is the gateway's own, per call and on the answer's path.
KNOWN_BODIES = body_reader.KnownBodies(max_bytes=settings.LEDGER_GATEWAY_KNOWN_BODY_BYTES)


def _conversation_key(request: HttpRequest, wire: Wire) -> tuple[str, ...] | None:
    """Whose conversation a body continues: the caller's key, session and thread. Bodies are
    only reused within one, so no caller's latency tells anything of another's. The key is
    kept as its digest: no token outlives its request in the server's memory."""
    key = request.headers.get("X-Ledger-Key")
    if not key:
        return None
    return (
        wire.NAME,
        hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest(),
        request.headers.get("X-Ledger-Session") or "",
        request.headers.get("X-Ledger-Thread") or "",
    )


@dataclass
class _Read:
    # The body as it is forwarded when nothing is fitted (its exact bytes).
    source: forward.Body
    value: Any
    # Its bytes when orjson read them: what a later call of the conversation may reuse.
    fast: bytes | None = None
    # Read from a known body of the conversation (body.KnownBodies): what was read anew.
    reading: body_reader.Reading | None = None

    @property
    def checked(self) -> int:
        """How many of its messages the known body held (checked when that call was)."""
        return self.reading.count if self.reading is not None else 0


def _read_json(request: HttpRequest, conversation: tuple[str, ...] | None = None) -> _Read:
    """The body as it is forwarded when nothing is fitted (its exact bytes), parsed once:
    from the `conversation`'s known bodies when one starts it, else whole.

    orjson reads it when its answer is exactly the strict reader's (body.py); the bytes are
    kept to forward. A large body is held at most twice at any moment (issue 22, row 14):
    the bytes (Django's hold let go of) and the parsed value. On the exact path the bytes are
    decoded, then let go of before the text is parsed, and the text is kept to forward: as
    UTF-8 it gives back exactly the bytes it came from."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise GatewayError(
            "the request body is too large", status=413, code="request_too_large"
        ) from None
    _release_body(request)
    release_freed_memory(len(raw))
    try:
        reading = (
            None
            if conversation is None
            else KNOWN_BODIES.read(conversation, raw, max_depth=MAX_JSON_DEPTH)
        )
        if reading is not None:
            return _Read(forward.Body(raw), reading.value, raw, reading)
        fast = body_reader.fast_loads(raw, max_depth=MAX_JSON_DEPTH)
    except body_reader.TooDeep:
        raise _too_deep() from None
    if fast is not None:
        # Forwarded as the bytes it came as; held beside the parsed value, as the text was.
        return _Read(forward.Body(raw), fast, raw)
    # What orjson refused or might read differently: the exact reader decides (body.py).
    # Its head names the model even when the rest is not JSON (the refused call's row).
    head = raw[:NAMED_MODEL_BYTES]
    try:
        encoding = json.detect_encoding(raw)
        if encoding in ("utf-8", "utf-8-sig"):
            # utf-8-sig: the body starts with a byte-order mark, which json.loads(bytes)
            # skips; it is forwarded as sent.
            prefix = codecs.BOM_UTF8 if encoding == "utf-8-sig" else b""
            # surrogatepass, as json.loads(bytes) decodes (and Body encodes back).
            text = raw.decode(encoding, "surrogatepass")
            source = forward.Body(text, length=len(raw), prefix=prefix)
            del raw
            body = strict_loads(text, finite=False)
        else:
            # UTF-16 or UTF-32 (JSON allows them; no provider SDK sends them): parsed and
            # forwarded as the bytes they are.
            source = forward.Body(raw)
            body = strict_loads(raw, finite=False)
    except (ValueError, UnicodeDecodeError):
        error = GatewayError("the request body is not valid JSON", code="malformed_json")
        error.named_model = named_model(head)
        raise error from None
    except RecursionError:
        # The decoder gives up on very deep input before returning anything.
        raise _too_deep() from None
    # The API's bound: nothing downstream (counting, json.dumps) may hit the recursion limit.
    if nests_deeper(body, MAX_JSON_DEPTH):
        raise _too_deep()
    return _Read(source, body)


# How much of a body that is not JSON is searched for the model it names.
NAMED_MODEL_BYTES = 65_536
_NAMED_MODEL = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){1,200})"')


def named_model(head: bytes) -> str:
    """The model a body that is not JSON names (`"model": "…"`), best effort, else ""."""
    found = _NAMED_MODEL.search(head)
    if found is None:
        return ""
    try:
        value = json.loads(b'"' + found.group(1) + b'"')
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""


def _release_body(request: HttpRequest) -> None:
    """Drop the request's own hold on its body. `HttpRequest.body` keeps the bytes (and a
    stream over them) on the request until it ends, which for a call streaming its reply can
    be minutes; nothing reads them again (the view keeps what it forwards)."""
    vars(request).pop("_body", None)
    request._stream = io.BytesIO()  # type: ignore[attr-defined]


def _too_deep() -> GatewayError:
    return GatewayError(
        f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="nesting_too_deep"
    )


# What an HTTP header value cannot carry: control characters (a NUL made the SDK fail with
# `illegal header line`) and lone surrogates (no encoding holds them: a 500). Model names come
# from the client's body or path and go back in X-Ledger-Model.
_UNFIT_FOR_HEADER = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _check_model(model: str) -> None:
    """Refuse a model name no response header can carry (issue 42, row 6): 400 `invalid_model`
    in the provider's shape, before anything is recorded or forwarded (the call's row is)."""
    found = _UNFIT_FOR_HEADER.search(model)
    if found is not None:
        raise GatewayError(
            f"the model name holds {_CHARACTER_NAMES.get(found.group(), 'a character')} "
            f"(U+{ord(found.group()):04X} at {found.start()}), which no model is named with",
            code="invalid_model",
            param="model",
        )


_CHARACTER_NAMES = {"\x00": "a NUL", "\t": "a tab", "\n": "a line break", "\r": "a line break"}


def _header_safe(value: str) -> str:
    """`value` as a response header can carry it: whatever was let through, never a broken
    response (a refused model name never gets here)."""
    return _UNFIT_FOR_HEADER.sub("?", value) if _UNFIT_FOR_HEADER.search(value) else value


def _ledger_headers(call: Call, fitted: Fitted) -> dict[str, str]:
    return {
        "X-Ledger-Session": str(call.session.pk),
        "X-Ledger-Context-Tokens": str(fitted.token_count),
        "X-Ledger-Percent-Used": f"{fitted.percent_used:.1f}",
        "X-Ledger-Compacted": "true" if fitted.compacted else "false",
        "X-Ledger-Model": _header_safe(fitted.model),
    }


def _upstream_headers(request: HttpRequest, wire: Wire) -> tuple[dict[str, str], str]:
    """The headers to forward and the query string left to forward. A key the client put in
    the query (Gemini's `?key=`) goes upstream in the wire's key header instead, unless that
    header is already there: no URL the gateway builds or sends holds a key."""
    headers = forward.forward_headers(request.headers)
    query = request.META.get("QUERY_STRING") or ""
    if not wire.KEY_QUERY or not query:
        return headers, query
    pairs = parse_qsl(query, keep_blank_values=True)
    keys = [value for name, value in pairs if name == wire.KEY_QUERY]
    if keys and not any(name.lower() == wire.KEY_HEADER for name in headers):
        headers[wire.KEY_HEADER] = keys[0]
    if keys:
        query = urlencode([(name, value) for name, value in pairs if name != wire.KEY_QUERY])
    return headers, query


def _fallbacks(request: HttpRequest) -> list[str]:
    header = request.headers.get("X-Ledger-Fallback-Models") or ""
    return [name.strip() for name in header.split(",") if name.strip()][:5]


# --- conversation calls: prepare → forward → respond --------------------------------------------


async def conversation(
    request: HttpRequest, wire: Wire, params: dict[str, str] | None = None
) -> HttpResponseBase:
    # Websocket pushes caused by this request go out on this loop without holding it up.
    broadcast.DEFER_TO_LOOP.set(asyncio.get_running_loop())
    # What the calls ledger keeps of this call, stored with the announcements (after.py).
    trace = calls.Trace(
        wire=wire.NAME,
        key=request.headers.get("X-Ledger-Key"),
        session_header=request.headers.get("X-Ledger-Session"),
        # Masked and stored after the response (calls.save).
        request_headers=request.headers,
    )
    announced = after.Announcements(trace)
    try:
        response = await _serve(request, wire, announced, params or {})
        trace.response_headers = response.headers
        # Sent once the answer is out (a stream's when it ends: its on_end in _respond).
        after.attach(response, announced)
    except asyncio.CancelledError:
        trace.end(CallStatus.CLIENT_DISCONNECTED)  # the client went away (Django cancels)
        announced.send_later()
        raise
    except BaseException as exc:
        trace.end(CallStatus.REFUSED, http_status=500, code="internal_error", error=repr(exc))
        announced.send_later()
        raise
    return response


@dataclass
class _Request:
    """A validated conversation request."""

    # The client's body, as it is forwarded when fitting changes nothing.
    raw: forward.Body
    body: dict[str, Any]
    parsed: ParsedRequest
    fit_enabled: bool
    # The path's parameters (a Gemini model and action).
    params: dict[str, str]
    # X-Ledger-Context-Limit: the window of the client's model (a local one the registry
    # does not know); None when not sent.
    context_limit: int | None = None
    # Whose conversation it continues, and what of its body the next call may reuse (body.py).
    conversation: tuple[str, ...] | None = None
    known: body_reader.Known | None = None


async def _serve(
    request: HttpRequest, wire: Wire, announced: after.Announcements, params: dict[str, str]
) -> HttpResponseBase:
    trace = announced.call
    assert trace is not None
    if request.method != "POST":
        trace.end(CallStatus.REFUSED, http_status=405, code="method_not_allowed")
        return _method_not_allowed(wire, ("POST",))
    # The model the call names, as early as it is known: a refusal's row says it too.
    trace.model_requested = str(params.get("model") or "")
    try:
        sent = _validate(request, wire, params, trace)
        trace.model_requested, trace.stream = sent.parsed.model, bool(sent.parsed.stream)
        # A request that continues a conversation the provider keeps shows only what is new:
        # its cache outcome cannot be predicted from it.
        trace.continues = bool(sent.parsed.continues)
        _check_model(sent.parsed.model)
        call = await _prepare(request, wire, sent, announced)
    except GatewayError as exc:
        return _refused(wire, trace, exc)
    if sent.conversation is not None and sent.known is not None:
        # Accepted (the caller is who it says): its next call reads only what it adds.
        KNOWN_BODIES.keep(sent.conversation, sent.known)
    # Freed with the announcements, once the response is out (after.py).
    announced.held += (sent, call)
    trace.session = call.session
    trace.request_map = call.request_map
    if call.request is not None and call.request.thread is not None:
        trace.thread = call.request.thread.key
    calls.track(trace)
    if call.budgets:
        assert call.fitted is not None
        try:
            trace.reservation = await workers.run(
                budget.reserve,
                found=call.budgets,
                model=call.fitted.model,
                tokens=call.fitted.token_count,
                body=sent.body,
            )
        except GatewayError as exc:
            return _refused(wire, trace, exc)
    forwarded = await _forward(request, wire, sent, call)
    if isinstance(forwarded, HttpResponseBase):
        return forwarded
    return await _respond(wire, call, forwarded, stream=sent.parsed.stream, body=sent.body)


def _context_limit(request: HttpRequest) -> int | None:
    """X-Ledger-Context-Limit as a window in tokens: decimal digits, 1 to the API's bound."""
    header = request.headers.get(CONTEXT_LIMIT_HEADER)
    if header is None:
        return None
    text = header.strip()
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= MAX_CONTEXT_LIMIT:
        raise GatewayError(
            f"{CONTEXT_LIMIT_HEADER} must be a whole number of tokens from 1 to "
            f"{MAX_CONTEXT_LIMIT}, got {header[:40]!r}",
            code="invalid_context_limit",
            param=CONTEXT_LIMIT_HEADER,
        )
    return int(text)


def _validate(
    request: HttpRequest, wire: Wire, params: dict[str, str], trace: calls.Trace
) -> _Request:
    context_limit = _context_limit(request)
    conversation = _conversation_key(request, wire)
    try:
        read = _read_json(request, conversation)
    except GatewayError as exc:
        trace.model_requested = trace.model_requested or exc.named_model
        raise
    raw, body = read.source, read.value
    if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"]:
        trace.model_requested = body["model"]
    # Taken before anything downstream could touch the value; kept once the call is accepted.
    known = (
        body_reader.remember(read.fast, body, wire.MESSAGES_PARAM, reading=read.reading)
        if conversation is not None and read.fast is not None
        else None
    )
    try:
        parsed = wire.parse_request(body, params, checked=read.checked)
    except GatewayInputError as exc:
        raise GatewayError(exc.message, param=exc.param) from None
    off = (request.headers.get("X-Ledger-Fit") or "").strip().lower() == "off"
    # A request that continues a conversation the provider keeps holds only what is new: the
    # gateway cannot fit what it cannot see, so it records and forwards as sent.
    fit_enabled = not off and not parsed.continues and not parsed.unfitted
    return _Request(
        raw=raw,
        body=body,
        parsed=parsed,
        fit_enabled=fit_enabled,
        params=params,
        context_limit=context_limit,
        conversation=conversation,
        known=known,
    )


async def _prepare(
    request: HttpRequest, wire: Wire, sent: _Request, announced: after.Announcements
) -> Call:
    call = await workers.run(
        announced.collecting,
        prepare,
        announced=announced,
        wire=wire,
        key=request.headers.get("X-Ledger-Key"),
        session_header=request.headers.get("X-Ledger-Session"),
        body=sent.body,
        units=sent.parsed.units,
        model=sent.parsed.model,
        fit_enabled=sent.fit_enabled,
        continues=sent.parsed.continues,
        thread_name=request.headers.get("X-Ledger-Thread"),
        context_limit=sent.context_limit,
        default_context_limit=settings.LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT or None,
    )
    if call.fitted is None:
        # May compact synchronously: not on the short hops' threads (prepare.py).
        call.fitted = await workers.run_long(
            announced.collecting,
            fit_call,
            call=call,
            wire=wire,
            body=sent.body,
            model=sent.parsed.model,
            enabled=sent.fit_enabled,
        )
    return call


@dataclass
class _Forwarded:
    response: forward.UpstreamResponse
    fitted: Fitted


async def _forward(
    request: HttpRequest, wire: Wire, sent: _Request, call: Call
) -> _Forwarded | HttpResponseBase:
    """Send to the request's model, then to each fallback model (fitted to its own window) on
    429, 5xx, a connection error or a timeout."""
    assert call.fitted is not None
    headers, _ = _upstream_headers(request, wire)
    base = _upstream_base(wire)
    model = sent.parsed.model
    models = [model, *[m for m in _fallbacks(request) if m != model]]
    fitted = call.fitted
    failure = ""
    trace = call.announced.call
    assert trace is not None
    ending: str = CallStatus.UPSTREAM_UNAVAILABLE
    for number, target in enumerate(models):
        last = number == len(models) - 1
        if number:
            try:
                fitted = await workers.run_long(
                    call.announced.collecting,
                    fit_call,
                    call=call,
                    wire=wire,
                    body=sent.body,
                    model=target,
                    enabled=sent.fit_enabled,
                    fresh=True,
                )
            except GatewayError as exc:
                failure = exc.message
                trace.attempt(target, "refused")
                if last:
                    return _refused(wire, trace, exc, _ledger_headers(call, fitted))
                continue
        # A fitted body is sent as text too: encoded whole, it was held twice more.
        content = sent.raw if fitted.body is None else forward.Body(json.dumps(fitted.body))
        url = wire.complete_url(base, model=target, stream=sent.parsed.stream, params=sent.params)
        trace.mark_forwarded()
        try:
            response = await forward.send(url=url, headers=headers, content=content)
        except forward.UpstreamError as exc:
            failure = f"the upstream for {target} could not be reached ({exc})"
            logger.warning("gateway: %s", failure)
            ending = _upstream_failed(exc)
            trace.attempt(target, ending)
            continue
        trace.attempt(target, "answered", response.status_code)
        if forward.is_retryable_status(response.status_code) and not last:
            logger.warning(
                "gateway: %s answered %s, trying the next model", target, response.status_code
            )
            await response.aclose()
            continue
        trace.mark_first_byte()
        return _Forwarded(response=response, fitted=fitted)
    return _refused(
        wire,
        trace,
        GatewayError(failure, status=502, code="upstream_unavailable"),
        _ledger_headers(call, fitted),
        status=ending,
    )


async def _respond(
    wire: Wire, call: Call, forwarded: _Forwarded, *, stream: bool, body: dict[str, Any]
) -> HttpResponseBase:
    """Relay the upstream's answer (streamed as it arrives) and record the reply."""
    response, fitted = forwarded.response, forwarded.fitted
    trace = call.announced.call
    assert trace is not None
    trace.model_served = fitted.model
    trace.fitted = fitted.body is not None
    # What went upstream, for the call's cache outcome (computed once the answer is out).
    trace.note_forwarded(
        wire=wire,
        body=body if fitted.body is None else fitted.body,
        how=(call.request.notes.get("last_fit") if call.request is not None else None)
        or ("compacted" if fitted.compression else ""),
        compacted=fitted.compression is not None,
        client_body=body if fitted.body is not None else None,
    )
    trace.forwarded_tokens = fitted.token_count
    trace.saved_tokens = saved_tokens(
        client_tokens=call.client_tokens, forwarded_tokens=fitted.token_count
    )
    trace.fit = _fit_note(call, fitted)
    passed = {**forward.returned_headers(response.headers), **_ledger_headers(call, fitted)}
    content_type = response.headers.get("content-type", "application/json")
    # An upstream may answer a streamed request with one JSON body (some compatible servers
    # ignore `stream`): relayed as it came, and recorded as the plain reply it is.
    plain = not content_type.startswith("text/event-stream")
    if response.status_code >= 400 or not stream or plain:
        try:
            data = await response.aread()
        except forward.UpstreamError as exc:
            # Headers came, then the body broke off or stalled past the timeout.
            return _refused(
                wire,
                trace,
                GatewayError(
                    f"the upstream broke off its answer ({exc})",
                    status=502,
                    code="upstream_unavailable",
                ),
                _ledger_headers(call, fitted),
                status=_upstream_failed(exc),
            )
        finally:
            await response.aclose()
        if response.status_code < 400:
            await _record_plain(wire=wire, call=call, fitted=fitted, data=data)
            trace.end(CallStatus.OK, http_status=response.status_code)
        else:
            trace.end(
                CallStatus.PROVIDER_ERROR,
                http_status=response.status_code,
                **_provider_error(data),
            )
        reply = HttpResponse(data, status=response.status_code, content_type=content_type)
        for name, value in passed.items():
            reply[name] = value
        return reply

    accumulator = wire.stream_accumulator(fitted.model)
    ending = StreamEnding()

    async def on_end(incomplete: bool) -> None:
        try:
            reply_message = _reply_of(accumulator)
            if reply_message is not None:
                await _record(call=call, fitted=fitted, reply=reply_message, incomplete=incomplete)
        finally:
            # The first chunk, not the headers: what a streaming client waits for.
            trace.first_byte = ending.first_chunk
            malformed = ending.reason == MALFORMED
            trace.end(
                _STREAM_STATUS.get(ending.reason, CallStatus.OK),
                http_status=response.status_code,
                code="malformed_event" if malformed else "",
                error=f"the provider sent an event the gateway could not read: {ending.detail}"
                if malformed
                else "",
            )
            call.announced.send_later()

    streamed = StreamingHttpResponse(
        relay(
            response=stream_limits.bounded(response),  # size/duration bounds (issue 22)
            accumulator=accumulator,
            stream_error=wire.stream_error,
            on_end=on_end,
            ending=ending,
        ),
        status=response.status_code,
        content_type=content_type,
    )
    streamed["Cache-Control"] = "no-cache"
    streamed["X-Accel-Buffering"] = "no"
    for name, value in passed.items():
        streamed[name] = value
    return streamed


def _fit_note(call: Call, fitted: Fitted) -> dict[str, Any]:
    """How fitting treated the request, for the calls ledger: per-thread fitting's own word
    (as_sent, fitted, compacted, pruned), else the ledger's ladder's ("ledger") or none
    ("off"); the request indices a per-call prune dropped when fitting says which."""
    notes = call.request.notes if call.request is not None else {}
    how = notes.get("last_fit") or ("ledger" if fitted.compacted else "as_sent")
    note: dict[str, Any] = {"how": how, "limit": fitted.limit}
    if not call.fit_enabled:
        note["how"] = "off"
    pruned = getattr(fitted, "pruned", ())
    if pruned:
        note["pruned"] = seq_runs(pruned)
    return note


async def _record_plain(*, wire: Wire, call: Call, fitted: Fitted, data: bytes) -> None:
    try:
        payload = provider_loads(data)
    except ValueError:
        logger.warning("gateway: the upstream's reply is not JSON; nothing recorded")
        return
    try:
        reply = wire.reply_from_response(payload, model=fitted.model)
    except Exception:  # any shape a provider may send: relayed as it came, not recorded
        logger.warning("gateway: the upstream's reply has a shape the gateway cannot read")
        return
    if reply is None:
        logger.warning("gateway: the upstream's reply has no message; nothing recorded")
        return
    await _record(call=call, fitted=fitted, reply=reply, incomplete=False)


def _reply_of(accumulator: StreamAccumulator) -> Reply | None:
    """The reply the stream carried, as far as it could be read (None when nothing could)."""
    try:
        return accumulator.reply()
    except Exception:  # what was read does not make a reply (an odd shape): nothing recorded
        logger.warning("gateway: a streamed reply could not be rebuilt; nothing recorded")
        return None


_STREAM_STATUS = {
    MALFORMED: CallStatus.PROVIDER_ERROR,
    "provider_error": CallStatus.PROVIDER_ERROR,
    "interrupted": CallStatus.INTERRUPTED,
    "client_disconnected": CallStatus.CLIENT_DISCONNECTED,
}


def _provider_error(data: bytes) -> dict[str, str]:
    """The provider's error code and message, from its error body (every wire nests them
    under `error`), for the call's row."""
    try:
        found = json.loads(data).get("error")
    except (ValueError, AttributeError):
        return {"error": data[:200].decode("utf-8", "replace")}
    if not isinstance(found, dict):
        return {}
    code = found.get("code") or found.get("type") or ""
    if isinstance(code, int):
        # A numeric code repeats the HTTP status; the canonical name, when the body has one
        # (`status`), says more.
        code = found.get("status") or code
    return {"code": str(code), "error": str(found.get("message") or "")}


async def _record(*, call: Call, fitted: Fitted, reply: Reply, incomplete: bool) -> None:
    # The provider answered (and billed) the call: its row carries the reply's usage whatever
    # happens next (a client that goes away cancels this coroutine while the reply is being
    # recorded; the recording itself runs on).
    if call.announced.call is not None:
        chains = call.request.chains if call.request is not None else ()
        # As record_thread_reply continues the chain (None: it computes it the long way).
        after_chain = (chains[-1] or None) if chains else ""
        call.announced.call.replied(reply=reply, after_chain=after_chain)
    # Bookkeeping trouble is logged and shown, never the call's failure.
    await workers.run(
        call.announced.collecting,
        thread_fit.record_thread_reply,
        session=call.session,
        request=call.request,
        length=call.position,
        reply=reply,
        forwarded_tokens=fitted.token_count,
        client_tokens=call.client_tokens,
        incomplete=incomplete,
        metadata={"requestedModel": fitted.model} if fitted.model != reply.model else None,
    )


# --- passthrough: endpoints the gateway has no rule for --------------------------------------------


async def passthrough(request: HttpRequest, wire: Wire, rest: str) -> HttpResponseBase:
    """Forward the request as sent (method, path below the prefix, query, body) to the
    wire's upstream and relay the answer; nothing is recorded. The caller must still hold
    an API token: the gateway is no open proxy."""
    try:
        await workers.run(authenticate, request.headers.get("X-Ledger-Key"))
        body = request.body
    except RequestDataTooBig:
        return _error(
            wire,
            GatewayError("the request body is too large", status=413, code="request_too_large"),
        )
    except GatewayError as exc:
        return _error(wire, exc)
    if _leaves_the_base(rest):
        return _error(
            wire,
            GatewayError(
                "the path may not hold '.' or '..' segments (encoded or not)",
                code="invalid_path",
            ),
        )
    headers, query = _upstream_headers(request, wire)
    # The path as the client encoded it: Django hands it over decoded, and `files%3Fkey=K`
    # sent as `files?key=K` became a query holding a key (issue 42, row 8).
    url = f"{_upstream_base(wire)}/{quote(rest, safe=_PATH_SAFE)}"
    if query:
        url += "?" + query
    try:
        response = await forward.send(
            url=url,
            headers=headers,
            content=body,
            method=request.method or "GET",
        )
    except forward.UpstreamError as exc:
        return _error(
            wire,
            GatewayError(
                f"the upstream could not be reached ({exc})",
                status=502,
                code="upstream_unavailable",
            ),
        )
    passed = forward.returned_headers(response.headers)
    content_type = response.headers.get("content-type", "application/json")
    if content_type.startswith("text/event-stream"):

        async def chunks() -> Any:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            except forward.UpstreamError as exc:
                yield wire.stream_error(f"the upstream stream was interrupted ({exc})")
            finally:
                await response.aclose()

        answer: HttpResponseBase = StreamingHttpResponse(
            chunks(), status=response.status_code, content_type=content_type
        )
        answer["Cache-Control"] = "no-cache"
    else:
        try:
            data = await response.aread()
        except forward.UpstreamError as exc:
            return _error(
                wire,
                GatewayError(
                    f"the upstream broke off ({exc})", status=502, code="upstream_unavailable"
                ),
            )
        finally:
            await response.aclose()
        answer = HttpResponse(data, status=response.status_code, content_type=content_type)
    for name, value in passed.items():
        answer[name] = value
    return answer


# What a path segment holds unencoded (RFC 3986's pchar, and `/` between segments).
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def _leaves_the_base(rest: str) -> bool:
    """Whether the path below the prefix holds a dot segment. Django hands it over decoded
    (`..%2F` is `../`), and the HTTP client resolves dot segments before sending: `v1/../admin`
    would reach the upstream's `/admin`, outside its base path. Decoded until it no longer
    changes (`%252e` is `%2e` once decoded, which a server may decode again), and a backslash
    counts as a slash (some servers read it as one)."""
    previous = None
    while rest != previous:
        previous, rest = rest, unquote(rest)
    return any(segment in (".", "..") for segment in rest.replace("\\", "/").split("/"))


# --- answered by the ledger itself ----------------------------------------------------------------


@lru_cache(maxsize=1)
def _model_list(overrides: str) -> list[dict[str, Any]]:
    return [
        {
            "id": info.model,
            "object": "model",
            "created": 0,
            "owned_by": info.provider or "context-ledger",
            "context_window": info.context_limit,
        }
        for info in model_registry().all_models()
    ]


async def models(request: HttpRequest, wire: Wire) -> HttpResponseBase:
    """The model registry in OpenAI's list shape."""
    if request.method != "GET":
        return _method_not_allowed(wire, ("GET",))
    try:
        await workers.run(authenticate, request.headers.get("X-Ledger-Key"))
    except GatewayError as exc:
        return _error(wire, exc)
    data = _model_list(json.dumps(settings.MODEL_CONTEXT_OVERRIDES, sort_keys=True))
    return JsonResponse({"object": "list", "data": data})


def _count_tokens(wire: Wire, body: dict[str, Any], params: dict[str, str]) -> int:
    parsed = wire.parse_request(body, params)
    model, units = parsed.model, parsed.units
    counter = tokens.counter_for_model(model)
    drafts = [
        draft
        for index, unit in enumerate(units)
        for draft in wire.to_client_message(unit, index).drafts
    ]
    costs = tokens.messages_batch_tokens(
        counter, [(ROLE_FOR_TYPE[d.type], d.content, d.name) for d in drafts]
    )
    total = tokens.context_tokens(costs)
    if body.get("tools"):
        total += tokens.non_text_tokens(body["tools"])
    return total


def _counted(request: HttpRequest, wire: Wire, params: dict[str, str]) -> int:
    """Read and count the body, holding one of the caller's heavy-request slots (sync; a
    long-work thread): a body of up to 32 MiB, counted whole, needs no provider key, so eight
    at once took every other user's reads with them (issue 42, row 2). Read and counted off
    the event loop, which serves every other call of the process meanwhile."""
    user = authenticate(request.headers.get("X-Ledger-Key"))
    try:
        with heavy_slot(user_id=user.pk):
            return _count_tokens(wire, _read_json(request).value, params)
    except TooManyRequests as exc:
        raise GatewayError(
            exc.detail, status=429, code="too_many_requests", retryAfter=RETRY_AFTER_SECONDS
        ) from None


async def count_tokens(
    request: HttpRequest, wire: Wire, params: dict[str, str] | None = None
) -> HttpResponseBase:
    """count_tokens, answered by the ledger's own counter."""
    if request.method != "POST":
        return _method_not_allowed(wire, ("POST",))
    try:
        count = await workers.run_long(_counted, request, wire, params or {})
    except GatewayInputError as exc:
        return _error(wire, GatewayError(exc.message, param=exc.param))
    except GatewayError as exc:
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status == 429 else None
        return _error(wire, exc, retry)
    return JsonResponse(wire.count_tokens_body(count))


# --- the prefixes' roots and unknown paths ------------------------------------------------------


async def root(request: HttpRequest, wire: Wire) -> HttpResponseBase:
    """A prefix's root: HEAD answers 200 (Claude Code probes `HEAD {ANTHROPIC_BASE_URL}`
    before it starts, as the real API answers it); anything else is a JSON 404."""
    if request.method == "HEAD":
        return HttpResponse(status=200, content_type="application/json")
    return await not_found(request, wire)


async def not_found(request: HttpRequest, wire: Wire, rest: str = "") -> HttpResponseBase:
    response = _error(
        wire,
        GatewayError(
            f"no gateway route for {request.method} {request.path}",
            status=404,
            code="unknown_url",
        ),
    )
    if request.method == "HEAD":
        response.content = b""
    return response


_KINDS: dict[str, Callable[..., Awaitable[HttpResponseBase]]] = {
    wire_kinds.CONVERSATION: conversation,
    wire_kinds.PASSTHROUGH: passthrough,
    wire_kinds.COUNT_TOKENS: count_tokens,
    wire_kinds.MODELS: models,
}


def view(
    kind: str,
    wire: Wire,
    *,
    upstream_path: str | None = None,
    params: tuple[tuple[str, str], ...] = (),
) -> View:
    """The async view serving `kind` routes of `wire` (urls.py builds the routes). A
    passthrough route with a fixed path forwards to that path below the upstream base; a
    conversation or count_tokens route hands the path's parameters (and the route's fixed
    ones) to the wire."""
    handler = _KINDS[kind]

    @csrf_exempt
    async def serve(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        if kind == wire_kinds.PASSTHROUGH:
            rest = kwargs.get("rest")
            if rest is None:
                assert upstream_path is not None
                rest = upstream_path.format(**kwargs)
            return await passthrough(request, wire, rest)
        if kind in (wire_kinds.CONVERSATION, wire_kinds.COUNT_TOKENS):
            # The query's parameters (Gemini's `alt`), then the path's, then the route's; a
            # key in the query is never among them.
            query = {k: v for k, v in request.GET.items() if k != wire.KEY_QUERY}
            return await handler(request, wire, {**query, **kwargs, **dict(params)})
        return await handler(request, wire)

    serve.__name__ = f"{wire.NAME}_{kind}"
    return serve


def prefix_view(handler: Callable[..., Awaitable[HttpResponseBase]], wire: Wire) -> View:
    @csrf_exempt
    async def serve(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
        return await handler(request, wire, **kwargs)

    serve.__name__ = f"{wire.NAME}_{handler.__name__}"
    return serve
