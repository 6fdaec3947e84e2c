"""The gateway's async views: validate → record and fit (one hop into the ORM's thread) →
forward (async, with failover) → record the reply.

Errors the gateway produces itself are shaped like the provider's, so the official SDKs raise
their usual exception classes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from compaction_app import broadcast
from compaction_app.gateway import after, anthropic, forward, openai, stream_limits, threads
from compaction_app.gateway.fit import Fitted, fit, model_window
from compaction_app.gateway.messages import (
    ClientMessage,
    GatewayError,
    GatewayInputError,
    Reply,
)
from compaction_app.gateway.record import (
    authenticate,
    caller_and_session,
    record_reply,
    record_request,
)
from compaction_app.gateway.stream import relay
from sessions_app import tokens
from sessions_app.api.parsers import MAX_JSON_DEPTH, check_depth, strict_loads
from sessions_app.errors import InvalidInput
from sessions_app.models import ROLE_FOR_TYPE, Session
from sessions_app.services import model_registry

logger = logging.getLogger("compaction_app.gateway")


def _upstream(wire: ModuleType) -> str:
    base = settings.LEDGER_OPENAI_UPSTREAM if wire is openai else settings.LEDGER_ANTHROPIC_UPSTREAM
    return str(wire.upstream_url(base))


def _error(
    wire: ModuleType, exc: GatewayError, headers: dict[str, str] | None = None
) -> JsonResponse:
    body = wire.error_body(
        exc.message, status=exc.status, code=exc.code, param=exc.param, **exc.extra
    )
    response = JsonResponse(body, status=exc.status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _read_json(request: HttpRequest) -> tuple[bytes, Any]:
    try:
        raw = request.body
    except RequestDataTooBig:
        raise GatewayError(
            "the request body is too large", status=413, code="request_too_large"
        ) from None
    try:
        body = strict_loads(raw)  # NaN/Infinity refused (hardening, issue 22)
    except (ValueError, UnicodeDecodeError):
        raise GatewayError("the request body is not valid JSON", code="malformed_json") from None
    except RecursionError:
        # The decoder gives up on very deep input before returning anything.
        raise _too_deep() from None
    try:
        # The API's bound: nothing downstream (counting, json.dumps) may hit the recursion limit.
        check_depth(body)
    except InvalidInput:
        raise _too_deep() from None
    return raw, body


def _too_deep() -> GatewayError:
    return GatewayError(
        f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="nesting_too_deep"
    )


class _Converter:
    """Client messages converted on demand (and once): matching touches only the new ones."""

    def __init__(self, wire: ModuleType, units: list[dict[str, Any]]) -> None:
        self.wire = wire
        self.units = units
        self.cache: dict[int, ClientMessage] = {}

    def __call__(self, index: int) -> ClientMessage:
        found = self.cache.get(index)
        if found is None:
            try:
                found = self.cache[index] = self.wire.to_client_message(self.units[index], index)
            except GatewayInputError as exc:
                raise GatewayError(exc.message, param=exc.param or "messages") from None
        return found


@dataclass
class _Call:
    session: Session
    user: Any
    position: int
    fitted: Fitted
    # What the call's appends announce, sent once the response is ready (see after.py).
    announced: after.Announcements


def _prepare(
    *,
    wire: ModuleType,
    key: str | None,
    session_header: str | None,
    body: dict[str, Any],
    units: list[dict[str, Any]],
    model: str,
    fit_enabled: bool,
    announced: after.Announcements,
) -> _Call:
    user, session = caller_and_session(key=key, header=session_header, model=model)
    window = model_window(session, model) if fit_enabled else None
    recorded = record_request(
        session=session, count=len(units), convert=_Converter(wire, units), window=window
    )
    fitted = fit(
        session=recorded.session,
        user=user,
        wire=wire,
        body=body,
        model=model,
        enabled=fit_enabled,
        same_model_as_request=True,
    )
    return _Call(
        session=recorded.session,
        user=user,
        position=len(units),
        fitted=fitted,
        announced=announced,
    )


def _refit(
    *, call: _Call, wire: ModuleType, body: dict[str, Any], model: str, fit_enabled: bool
) -> Fitted:
    session = Session.objects.get(pk=call.session.pk)
    return fit(
        session=session,
        user=call.user,
        wire=wire,
        body=body,
        model=model,
        enabled=fit_enabled,
        same_model_as_request=False,
    )


def _ledger_headers(call: _Call, fitted: Fitted) -> dict[str, str]:
    return {
        "X-Ledger-Session": str(call.session.pk),
        "X-Ledger-Context-Tokens": str(fitted.token_count),
        "X-Ledger-Percent-Used": f"{fitted.percent_used:.1f}",
        "X-Ledger-Compacted": "true" if fitted.compacted else "false",
        "X-Ledger-Model": fitted.model,
    }


def _fallbacks(request: HttpRequest) -> list[str]:
    header = request.headers.get("X-Ledger-Fallback-Models") or ""
    return [name.strip() for name in header.split(",") if name.strip()][:5]


async def _handle(request: HttpRequest, wire: ModuleType) -> HttpResponseBase:
    # Websocket pushes caused by this request go out on this loop without holding it up.
    broadcast.DEFER_TO_LOOP.set(asyncio.get_running_loop())
    announced = after.Announcements()
    try:
        response = await _serve(request, wire, announced)
    except BaseException:
        announced.send_later()
        raise
    if not isinstance(response, StreamingHttpResponse):
        announced.send_later()
    # A stream sends them when it ends (on_end below).
    return response


async def _serve(
    request: HttpRequest, wire: ModuleType, announced: after.Announcements
) -> HttpResponseBase:
    if request.method != "POST":
        return _error(wire, GatewayError("use POST", status=405, code="method_not_allowed"))
    try:
        raw, body = _read_json(request)
        model, _, stream = wire.parse_request(body)
    except GatewayInputError as exc:
        return _error(wire, GatewayError(exc.message, param=exc.param))
    except GatewayError as exc:
        return _error(wire, exc)
    units = wire.client_messages(body)
    fit_enabled = (request.headers.get("X-Ledger-Fit") or "").strip().lower() != "off"
    try:
        call = await threads.run(
            announced.collecting,
            _prepare,
            announced=announced,
            wire=wire,
            key=request.headers.get("X-Ledger-Key"),
            session_header=request.headers.get("X-Ledger-Session"),
            body=body,
            units=units,
            model=model,
            fit_enabled=fit_enabled,
        )
    except GatewayError as exc:
        return _error(wire, exc)

    headers = forward.forward_headers(request.headers)
    url = _upstream(wire)
    models = [model, *[m for m in _fallbacks(request) if m != model]]
    fitted = call.fitted
    response: forward.UpstreamResponse | None = None
    failure = ""
    for number, target in enumerate(models):
        last = number == len(models) - 1
        if number:
            try:
                fitted = await threads.run(
                    announced.collecting,
                    _refit,
                    call=call,
                    wire=wire,
                    body=body,
                    model=target,
                    fit_enabled=fit_enabled,
                )
            except GatewayError as exc:
                failure = exc.message
                if last:
                    return _error(wire, exc, _ledger_headers(call, fitted))
                continue
        content = raw if fitted.body is None else json.dumps(fitted.body).encode()
        try:
            response = await forward.send(url=url, headers=headers, content=content)
        except forward.UpstreamError as exc:
            failure = f"the upstream for {target} could not be reached ({exc})"
            logger.warning("gateway: %s", failure)
            response = None
            continue
        if forward.is_retryable_status(response.status_code) and not last:
            logger.warning(
                "gateway: %s answered %s, trying the next model", target, response.status_code
            )
            await response.aclose()
            response = None
            continue
        break
    ledger = _ledger_headers(call, fitted)
    if response is None:
        return _error(wire, GatewayError(failure, status=502, code="upstream_unavailable"), ledger)

    passed = {**forward.returned_headers(response.headers), **ledger}
    content_type = response.headers.get("content-type", "application/json")
    if response.status_code >= 400 or not stream:
        data = await response.aread()
        await response.aclose()
        if response.status_code < 400:
            await _record_plain(wire=wire, call=call, fitted=fitted, data=data)
        reply = HttpResponse(data, status=response.status_code, content_type=content_type)
        for name, value in passed.items():
            reply[name] = value
        return reply

    accumulator = wire.StreamAccumulator(fitted.model)

    async def on_end(incomplete: bool) -> None:
        try:
            reply_message = accumulator.reply()
            if reply_message is not None:
                await _record(call=call, fitted=fitted, reply=reply_message, incomplete=incomplete)
        finally:
            announced.send_later()

    streamed = StreamingHttpResponse(
        relay(
            response=stream_limits.bounded(response),  # size/duration bounds (issue 22)
            accumulator=accumulator,
            stream_error=wire.stream_error,
            on_end=on_end,
        ),
        status=response.status_code,
        content_type=content_type,
    )
    streamed["Cache-Control"] = "no-cache"
    streamed["X-Accel-Buffering"] = "no"
    for name, value in passed.items():
        streamed[name] = value
    return streamed


async def _record_plain(*, wire: ModuleType, call: _Call, fitted: Fitted, data: bytes) -> None:
    try:
        payload = json.loads(data)
    except ValueError:
        logger.warning("gateway: the upstream's reply is not JSON; nothing recorded")
        return
    reply = wire.reply_from_response(payload, model=fitted.model)
    if reply is None:
        logger.warning("gateway: the upstream's reply has no message; nothing recorded")
        return
    await _record(call=call, fitted=fitted, reply=reply, incomplete=False)


async def _record(*, call: _Call, fitted: Fitted, reply: Reply, incomplete: bool) -> None:
    await threads.run(
        call.announced.collecting,
        record_reply,
        session=call.session,
        position=call.position,
        reply=reply,
        forwarded_tokens=fitted.token_count,
        incomplete=incomplete,
        metadata={"requestedModel": fitted.model} if fitted.model != reply.model else None,
    )


@csrf_exempt
async def openai_chat_completions(request: HttpRequest) -> HttpResponseBase:
    return await _handle(request, openai)


@csrf_exempt
async def anthropic_messages(request: HttpRequest) -> HttpResponseBase:
    return await _handle(request, anthropic)


def _user_for(key: str | None) -> Any:
    return authenticate(key)


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


@csrf_exempt
async def openai_models(request: HttpRequest) -> HttpResponse:
    """The model registry in OpenAI's list shape."""
    if request.method != "GET":
        return _error(openai, GatewayError("use GET", status=405, code="method_not_allowed"))
    try:
        await threads.run(_user_for, key=request.headers.get("X-Ledger-Key"))
    except GatewayError as exc:
        return _error(openai, exc)
    data = _model_list(json.dumps(settings.MODEL_CONTEXT_OVERRIDES, sort_keys=True))
    return JsonResponse({"object": "list", "data": data})


def _count_tokens(body: dict[str, Any]) -> int:
    model, units, _ = anthropic.parse_request(body)
    counter = tokens.counter_for_model(model)
    drafts = [
        draft
        for index, unit in enumerate(units)
        for draft in anthropic.to_client_message(unit, index).drafts
    ]
    costs = tokens.messages_batch_tokens(
        counter, [(ROLE_FOR_TYPE[d.type], d.content, d.name) for d in drafts]
    )
    total = tokens.context_tokens(costs)
    if body.get("tools"):
        total += tokens.non_text_tokens(body["tools"])
    return total


@csrf_exempt
async def anthropic_count_tokens(request: HttpRequest) -> HttpResponse:
    """Anthropic's count_tokens, answered by the ledger's own counter."""
    if request.method != "POST":
        return _error(anthropic, GatewayError("use POST", status=405, code="method_not_allowed"))
    try:
        await threads.run(_user_for, key=request.headers.get("X-Ledger-Key"))
        _, body = _read_json(request)
        count = _count_tokens(body)
    except GatewayInputError as exc:
        return _error(anthropic, GatewayError(exc.message, param=exc.param))
    except GatewayError as exc:
        return _error(anthropic, exc)
    return JsonResponse({"input_tokens": count})
