"""OpenTelemetry spans, exported over OTLP/HTTP when the standard variables ask for it.

With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, every
gateway call is a span following the GenAI semantic conventions, and every finished
compaction run a span of its own; the other standard variables (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*`, `OTEL_SDK_DISABLED`,
`OTEL_TRACES_EXPORTER=none`, …) mean what they mean everywhere. Unset, nothing is built and
nothing is exported.

Export never slows or fails a call: a call's span is built from what the calls ledger
measured (calls.Trace: its start, first send upstream, first byte and end), after the
response, on the thread that stores the call, with the moments it measured; the SDK's batch
processor queues it and a thread of its own sends it. A full queue drops spans, a collector
that is down loses them; neither reaches a call. A client's `traceparent` makes the call's
span a child of the client's trace.

The `ledger.*` attributes (docs/operations.md lists them): ledger.session.id,
ledger.thread, ledger.context.tokens (what was forwarded, our count), ledger.context.window,
ledger.context.percent_used, ledger.compacted (fitting changed what was forwarded),
ledger.fit (how: as_sent, fitted, compacted, pruned, ledger, off), ledger.saved_tokens,
ledger.call.id, ledger.cost_usd, ledger.gateway.duration (seconds before forwarding); on a
run's span ledger.compaction.* (id, trigger, strategy, status, tokens_before, tokens_after,
reduction_percent, events_folded, summary_tokens, evidence_before, evidence_kept,
kept_percent).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

logger = logging.getLogger("compaction_app.telemetry")

_lock = threading.Lock()
# (process id, tracer or None): built once per process (a forked worker builds its own: the
# batch processor's thread does not survive a fork).
_state: tuple[int, Any] | None = None
_provider: Any = None

# gen_ai.provider.name and gen_ai.operation.name per wire (the conventions' own values).
PROVIDERS = {
    "openai": ("openai", "chat"),
    "responses": ("openai", "chat"),
    "anthropic": ("anthropic", "chat"),
    "gemini": ("gcp.gemini", "generate_content"),
}


def enabled() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def tracer() -> Any:
    """This process's tracer, or None when export is off (built on first use)."""
    global _state
    pid = os.getpid()
    state = _state
    if state is not None and state[0] == pid:
        return state[1]
    with _lock:
        if _state is not None and _state[0] == pid:
            return _state[1]
        built = _build() if enabled() else None
        _state = (pid, built)
        return built


def _build() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "context-ledger"}
        )
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        global _provider
        _provider = provider
        return provider.get_tracer("context-ledger")
    except Exception:
        logger.exception("OpenTelemetry: the exporter could not be set up; no spans")
        return None


def flush(timeout_millis: int = 5000) -> None:
    """Send what is queued now (tests, shutdown)."""
    if _provider is not None:
        _provider.force_flush(timeout_millis)


def _ns(moment: Any) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _parent(headers: Any) -> Any:
    if not headers or not headers.get("traceparent"):
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": headers.get("traceparent")}
    if headers.get("tracestate"):
        carrier["tracestate"] = headers.get("tracestate")
    return TraceContextTextMapPropagator().extract(carrier)


def call_span(trace_: Any, call: Any = None) -> None:
    """The span of one gateway call (calls.Trace), from the moments it measured. Never raises."""
    found = tracer()
    if found is None:
        return
    try:
        _call_span(found, trace_, call)
    except Exception:
        logger.exception("OpenTelemetry: a call's span could not be built")


def _call_span(found: Any, t: Any, call: Any) -> None:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    provider, operation = PROVIDERS.get(t.wire, (t.wire, "chat"))
    model = t.model_requested or ""
    start = _ns(t.started_at)

    def at(moment: float | None) -> int | None:
        return None if moment is None else start + int((moment - t.started) * 1_000_000_000)

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "gen_ai.request.stream": bool(t.stream),
        "ledger.wire": t.wire,
        "ledger.status": t.status,
        "ledger.thread": t.thread or "",
        "ledger.fit": (t.fit or {}).get("how", ""),
        "ledger.compacted": bool(t.fitted),
        "ledger.saved_tokens": int(t.saved_tokens or 0),
    }
    if t.http_status is not None:
        attributes["http.response.status_code"] = int(t.http_status)
    if t.model_served:
        attributes["gen_ai.response.model"] = t.model_served
    session = t.session
    if session is not None:
        attributes["ledger.session.id"] = str(session.pk)
        attributes["gen_ai.conversation.id"] = str(session.pk)
    if call is not None:
        attributes["ledger.call.id"] = str(call.pk)
        if call.cost_nano_usd is not None:
            attributes["ledger.cost_usd"] = call.cost_nano_usd / 1e9
    limit = (t.fit or {}).get("limit")
    if t.forwarded_tokens is not None:
        attributes["ledger.context.tokens"] = int(t.forwarded_tokens)
        if limit:
            from sessions_app.context_window import window_level

            level = window_level(
                tokens=int(t.forwarded_tokens),
                window=int(limit),
                compact_threshold=1.0,
                hard_threshold=1.0,
            )
            attributes["ledger.context.window"] = int(limit)
            attributes["ledger.context.percent_used"] = round(100 * level.ratio, 2)
    if t.forwarded is not None:
        attributes["ledger.gateway.duration"] = max(t.forwarded - t.started, 0.0)
    if t.first_byte is not None and t.stream:
        attributes["gen_ai.response.time_to_first_chunk"] = max(t.first_byte - t.started, 0.0)
    reply = t.reply
    if reply is not None:
        for name, value in (
            ("gen_ai.usage.input_tokens", reply.prompt_tokens),
            ("gen_ai.usage.output_tokens", reply.completion_tokens),
            ("gen_ai.usage.cache_read.input_tokens", reply.cached_input_tokens),
            ("gen_ai.usage.cache_creation.input_tokens", reply.cache_write_tokens),
        ):
            if value is not None:
                attributes[name] = int(value)
    span = found.start_span(
        f"{operation} {model}".strip(),
        context=_parent(t.request_headers),
        kind=SpanKind.CLIENT,
        attributes=attributes,
        start_time=start,
    )
    if t.status and t.status != "ok":
        span.set_attribute("error.type", t.error_code or t.status)
        span.set_status(Status(StatusCode.ERROR, (t.error or t.status)[:200]))
    span.end(end_time=at(t.ended) or start)


def run_span(run: Any) -> None:
    """The span of one finished compaction run (its start to its end). Never raises."""
    found = tracer()
    if found is None:
        return
    try:
        _run_span(found, run)
    except Exception:
        logger.exception("OpenTelemetry: a run's span could not be built")


def _run_span(found: Any, run: Any) -> None:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    begun = run.started_at or run.created_at
    attributes: dict[str, Any] = {
        "ledger.session.id": str(run.session_id),
        "ledger.thread": run.thread or "",
        "ledger.compaction.id": str(run.pk),
        "ledger.compaction.trigger": run.trigger,
        "ledger.compaction.strategy": run.strategy,
        "ledger.compaction.status": run.status,
        "ledger.compaction.events_folded": int(run.folded_count or 0),
    }
    for name, value in (
        ("ledger.compaction.tokens_before", run.tokens_before),
        ("ledger.compaction.tokens_after", run.tokens_after),
        ("ledger.compaction.events_before", run.events_before),
        ("ledger.compaction.events_after", run.events_after),
        ("ledger.compaction.summary_tokens", run.summary_tokens),
    ):
        if value is not None:
            attributes[name] = int(value)
    if run.reduction_percent is not None:
        attributes["ledger.compaction.reduction_percent"] = float(run.reduction_percent)
    loss = run.loss_report or {}
    for name, key in (
        ("ledger.compaction.evidence_before", "evidenceBefore"),
        ("ledger.compaction.evidence_kept", "evidenceKept"),
        ("ledger.compaction.kept_percent", "keptPercent"),
    ):
        if isinstance(loss.get(key), int | float):
            attributes[name] = loss[key]
    span = found.start_span(
        f"compaction {run.strategy}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        start_time=_ns(begun),
    )
    if run.status == "failed":
        span.set_attribute("error.type", "compaction_failed")
        span.set_status(Status(StatusCode.ERROR, (run.error or "failed")[:200]))
    span.end(end_time=_ns(run.finished_at or begun))
