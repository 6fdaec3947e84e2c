"""OpenTelemetry over OTLP/HTTP, received from a running server and decoded with
`opentelemetry-proto`: every gateway call is a span in the GenAI semantic conventions with the
`ledger.*` attributes, a client's traceparent makes it a child of the client's trace, and a
compaction run is a span with its before / after and loss figures. Unset, nothing is built."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from compaction_app import telemetry
from compaction_app.testkit.provider_standin import ProviderStandIn, Step
from tests.support.live_ledger import live_ledger

pytestmark = pytest.mark.profile_independent

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    for resource_spans in request.resource_spans:
                        resource = _attributes(resource_spans.resource.attributes)
                        for scope in resource_spans.scope_spans:
                            collector.spans += [(resource, span) for span in scope.spans]
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, predicate: Any, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [(r, s) for r, s in self.spans if predicate(s)]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no such span; got {[s.name for _, s in self.spans]}")


def _attributes(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        kind = item.value.WhichOneof("value")
        out[item.key] = getattr(item.value, kind) if kind else None
    return out


def test_it_exports_gateway_calls_and_compactions_as_genai_spans():
    collector = Collector()
    with (
        ProviderStandIn() as upstream,
        live_ledger(
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
            OTEL_BSP_SCHEDULE_DELAY="100",
            OTEL_SERVICE_NAME="ledger-under-test",
            LEDGER_OPENAI_UPSTREAM=upstream.openai_url,
            LEDGER_ANTHROPIC_UPSTREAM=upstream.anthropic_url,
        ) as ledger,
    ):
        key = ledger.tokens["alice"]
        headers = {"X-Ledger-Key": key, "X-Ledger-Session": "otel"}
        upstream.script(Step(text="One.", prompt_tokens=50, cache_read_tokens=20))
        client = openai.OpenAI(
            api_key="sk-test",
            base_url=f"{ledger.base_url}/gateway/openai/v1",
            default_headers={**headers, "traceparent": TRACEPARENT},
        )
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
        upstream.script(Step(text="two three four", prompt_tokens=30, cache_write_tokens=12))
        claude = anthropic.Anthropic(
            api_key="sk-ant-test",
            base_url=f"{ledger.base_url}/gateway/anthropic",
            default_headers={**headers, "X-Ledger-Session": "otel-claude"},
        )
        with claude.messages.stream(
            model="claude-3.5-sonnet", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            "".join(stream.text_stream)

        ((resource, chat),) = collector.wait(lambda s: s.name == "chat gpt-4o")
        attrs = _attributes(chat.attributes)
        assert resource["service.name"] == "ledger-under-test"
        assert chat.kind == chat.SPAN_KIND_CLIENT
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["gen_ai.request.model"] == "gpt-4o"
        assert attrs["gen_ai.response.model"] == "gpt-4o"
        assert attrs["gen_ai.usage.input_tokens"] == 50
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == 20
        assert attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["ledger.context.tokens"] > 0 and attrs["ledger.context.window"] == 128_000
        assert 0 < attrs["ledger.context.percent_used"] < 1  # 2 decimals
        assert attrs["ledger.compacted"] is False and attrs["ledger.fit"] == "as_sent"
        assert attrs["gen_ai.conversation.id"] == attrs["ledger.session.id"]
        assert attrs["ledger.gateway.duration"] >= 0
        # A child of the client's trace.
        assert chat.trace_id.hex() == TRACE_ID
        assert chat.parent_span_id.hex() == "00f067aa0ba902b7"
        assert chat.end_time_unix_nano >= chat.start_time_unix_nano

        ((_, claude_span),) = collector.wait(lambda s: s.name == "chat claude-3.5-sonnet")
        attrs = _attributes(claude_span.attributes)
        assert attrs["gen_ai.provider.name"] == "anthropic"
        assert attrs["gen_ai.request.stream"] is True
        assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 12
        assert attrs["gen_ai.response.time_to_first_chunk"] > 0

        # A compaction run, started through the API.
        api = httpx.Client(base_url=ledger.base_url, headers={"Authorization": f"Token {key}"})
        session = api.post("/api/v1/sessions", json={"model": "gpt-4o"}).json()
        turns = []
        for n in range(6):
            turns += [
                {"type": "USER_MESSAGE", "content": f"Step {n}: check /srv/app/config_{n}.yml"},
                {"type": "AGENT_MESSAGE", "content": f"Checked config_{n}: exit code {n}. " * 20},
            ]
        assert api.post(f"/api/v1/sessions/{session['id']}/events", json=turns).status_code == 201
        run = api.post(f"/api/v1/sessions/{session['id']}/compactions", json={}).json()
        ((_, compaction),) = collector.wait(
            lambda s: _attributes(s.attributes).get("ledger.compaction.id") == run["id"]
        )
        attrs = _attributes(compaction.attributes)
        assert compaction.name == "compaction summarize"
        assert attrs["ledger.compaction.status"] == "completed"
        assert attrs["ledger.compaction.trigger"] == "manual"
        assert attrs["ledger.compaction.tokens_after"] < attrs["ledger.compaction.tokens_before"]
        assert "ledger.compaction.kept_percent" in attrs
        assert attrs["ledger.session.id"] == session["id"]
    collector.server.shutdown()


def test_it_builds_nothing_when_no_endpoint_is_set(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(telemetry, "_state", None)
    assert telemetry.enabled() is False and telemetry.tracer() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert telemetry.enabled() is False
