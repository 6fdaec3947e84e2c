"""Gateway benchmark: the latency the gateway adds to a provider call, and concurrent clients
on one session.

For each profile a child process migrates a throwaway database, starts the provider stand-in
(tests/provider_standin.py) in a thread and the app in subprocesses, then times the same
requests sent to the stand-in directly and through the gateway. embedded: one daphne on SQLite
with the in-memory layer (as `manage.py serve`). postgres: the production profile, two daphne
processes (calls alternate between them, as behind a load balancer) and a separate Celery
worker, on PostgreSQL and Redis. Measured:
- N-message conversations (N = 20, 400 and 1,600; `--sizes`) in their steady state: the
  session already holds the first N − 1 messages, the request adds one (one session per call,
  prepared unmeasured);
- non-streaming (full response) and streaming (time to the first body chunk);
- beside the gateway, in the same run and interleaved call by call, a bare aiohttp proxy (its
  own process: forwards the bytes, relays the answer, nothing else): what any Python proxy
  costs on this machine; and the growth of the added p50 from the smallest size to the
  largest, the gateway's beside the bare proxy's;
- the same for the Responses API (`/responses`, input items resent in full as `store: false`
  clients do) at 20 messages;
- the same for Gemini's wire (`/gateway/gemini/v1beta/models/{model}:generateContent`, and
  `:streamGenerateContent?alt=sse` for the first chunk) at 20 messages, beside direct and the
  bare proxy;
- 8 threads, each its own conversation on ONE session: every message recorded exactly once,
  and every call's row in the calls ledger;
- the slow path (issue 42), at `--slow-size` messages (1,600) of a coding agent's loop (tool
  calls and results): beside the agent loop's next call, a retry (the same body again, as a
  client resends after a timeout) and an edited history (old tool results cleared, as Claude
  Code's microcompaction does: the body changes some 20 to 40 messages from its end), each
  through the gateway, the bare proxy and, given `--litellm PATH` (a LiteLLM proxy's
  executable; `bench/litellm.sh` installs one in a venv of its own), LiteLLM's proxy. Target:
  the retry's and the edit's added p50 within 1.5x the loop's.

- with `--otel collector`, the servers export every call's span (OTEL_EXPORTER_OTLP_ENDPOINT)
  to a local OTLP/HTTP receiver (a thread of the bench that accepts POST /v1/traces and
  counts the spans it decodes); with `--otel dead`, to a port nothing listens on. The figures
  read beside a run without export (`--otel off`, the default): the export must not slow a
  call, and a dead collector must not fail one (every call is still answered 200 and
  recorded). `--only hot` runs the conversation sizes alone (no Responses, Gemini, threads
  or slow path).

    .venv/bin/python bench/bench_gateway.py [--profile embedded|postgres|both] [--calls 300]
        [--sizes 20,400,1600] [--slow-size 1600] [--slow-calls 150] [--litellm PATH]
        [--only slow|hot] [--otel off|collector|dead]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from harness import Row, emit, run_profiles  # noqa: E402
from harness import row as _row  # noqa: E402

PG_DB = "bench_gateway"
MODEL = "gpt-4o"
SIZES = (20, 400, 1600)
# p50 added ms, (full response, time to first chunk), per conversation size; 1,600 messages:
# at most GROWTH x the 20-message figure (issue 31, item 5).
TARGETS = {20: (5.0, 4.0), 400: (25.0, 25.0)}
GROWTH = 1.3
RESPONSES_TARGETS = (15.0, 15.0)  # 20 messages
GEMINI_MODEL = "gemini-2.5-pro"
GEMINI_PLAIN = f"/v1beta/models/{GEMINI_MODEL}:generateContent"
GEMINI_STREAM = f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent?alt=sse"
THREADS = 8
# The slow path (issue 42): a retry's and an edited history's added p50 over the agent loop's.
SLOW_RATIO = 1.5
# Tool results kept whole before the edit clears older ones (the prepared call keeps more).
KEEP_RESULTS_BEFORE, KEEP_RESULTS_AFTER = 10, 5
CLEARED = "[Old tool result content cleared]"
# The server's LEDGER_GATEWAY_KNOWN_BODY_BYTES in the bench (--known-body-bytes).
KNOWN_BYTES = 2 << 30
CALLS_PER_THREAD = 25


_SERVE = (
    "import os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
    "import django; django.setup(); from compaction_app.http_server import run; "
    "run(host='127.0.0.1', port=int(sys.argv[1]))"
)


def _message(index: int) -> dict[str, str]:
    if index % 2:
        return {
            "role": "assistant",
            "content": f"Step {index}: I read src/module_{index}.py and changed handler_{index} "
            "to check the key first; tests pass. Next I will look at the caller.",
        }
    return {
        "role": "user",
        "content": f"Request {index}: please look at src/module_{index}.py, the KeyError in "
        f"handler_{index} comes back when the config omits 'timeout'. Fix it and run the tests.",
    }


def _conversation(size: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a careful coding agent."}] + [
        _message(i) for i in range(size - 1)
    ]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- child ------------------------------------------------------------------------------------


def _child(
    profile: str,
    calls: int,
    sizes: tuple[int, ...] = SIZES,
    known_body_bytes: int = KNOWN_BYTES,
    *,
    slow_size: int = 1600,
    slow_calls: int = 150,
    litellm: str = "",
    only: str = "",
    otel: str = "off",
) -> list[Row]:
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    if profile == "postgres" and not os.environ.get("DATABASE_URL", "").endswith(f"/{PG_DB}"):
        raise SystemExit(f"refusing to run: DATABASE_URL is not the {PG_DB} bench database")
    if profile == "embedded" and (os.environ.get("DATABASE_URL") or not os.environ.get("VAR_DIR")):
        raise SystemExit("refusing to run: the embedded bench needs a temporary VAR_DIR")
    import django

    django.setup()
    import httpx
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from compaction_app.testkit.provider_standin import ECHO, ProviderStandIn, Step

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(username="bench", password="bench-password")
    token = Token.objects.create(user=user).key

    standin = ProviderStandIn(default=Step(text=ECHO, prompt_tokens=100)).start()
    standin.keep_requests = False
    env = {
        **os.environ,
        "LEDGER_OPENAI_UPSTREAM": standin.openai_url,
        "LEDGER_GEMINI_UPSTREAM": standin.gemini_url,
        # Room for every conversation the bench keeps going (one per call): each call is one
        # agent's next call. `--known-body-bytes 0` reads every body whole.
        "LEDGER_GATEWAY_KNOWN_BODY_BYTES": str(known_body_bytes),
    }
    for name in [name for name in env if name.startswith("OTEL_")]:
        del env[name]
    collector = _OtlpReceiver().start() if otel == "collector" else None
    if collector is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.url
    elif otel == "dead":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{_free_port()}"
    if otel != "off":
        env["OTEL_SERVICE_NAME"] = "bench-gateway"
    production = profile == "postgres"
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    processes: list[subprocess.Popen] = []
    ports = [_free_port() for _ in range(2 if production else 1)]
    for port in ports:
        # The server `manage.py serve` runs: daphne with the project's request handling
        # (compaction_app/http_server.py).
        command = ["-c", _SERVE, str(port)]
        processes.append(
            subprocess.Popen(
                [sys.executable, *command], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log
            )
        )
    if production:
        worker = ["-m", "celery", "-A", "config", "worker", "-l", "warning", "--concurrency", "2"]
        processes.append(
            subprocess.Popen(
                [sys.executable, *worker], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log
            )
        )
    # A bare aiohttp proxy beside the gateway: what any proxy in Python costs on this machine.
    bare_port = _free_port()
    processes.append(
        subprocess.Popen(
            [sys.executable, __file__, "--bare-proxy", str(bare_port), standin.base],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    )
    bare = f"http://127.0.0.1:{bare_port}"
    lite = _start_litellm(litellm, standin.openai_url, processes, log) if litellm else None
    rows: list[Row] = []
    try:
        bases = [f"http://127.0.0.1:{port}/gateway/openai/v1" for port in ports]
        gateways = [base + "/chat/completions" for base in bases]
        direct = standin.openai_url + "/chat/completions"
        deadline = time.monotonic() + 120  # the servers start beside LiteLLM
        for probe in [f"http://127.0.0.1:{port}/gateway/openai/v1/models" for port in ports] + [
            bare + "/v1/models"
        ]:
            while True:
                try:
                    httpx.get(probe, timeout=2)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        if lite is not None:
            _wait_http(lite + "/health/liveliness", deadline=time.monotonic() + 120)
        added: dict[tuple[str, str, int], float] = {}
        if only == "hot":
            rows += _latency(
                profile,
                sizes,
                calls,
                token,
                gateways,
                direct,
                bare=bare + "/v1/chat/completions",
                added=added,
            )
            rows += _growth(profile, added, sizes)
        elif only != "slow":
            try:
                # All sizes in one pass, call by call, so a drift in the machine's load over the
                # run weighs on each size alike (the growth compares them).
                rows += _latency(
                    profile,
                    sizes,
                    calls,
                    token,
                    gateways,
                    direct,
                    bare=bare + "/v1/chat/completions",
                    added=added,
                )
            except Exception as exc:
                traceback.print_exc()
                rows.append(_row(profile, "conversation sizes", f"failed: {exc}"[:300], ok=False))
            rows += _growth(profile, added, sizes)
            try:
                rows += _latency(
                    profile,
                    (20,),
                    calls,
                    token,
                    [base + "/responses" for base in bases],
                    standin.openai_url + "/responses",
                    wire="responses",
                )
            except Exception as exc:
                traceback.print_exc()
                rows.append(
                    _row(profile, "Responses, 20 messages", f"failed: {exc}"[:300], ok=False)
                )
            try:
                rows += _latency(
                    profile,
                    (20,),
                    calls,
                    token,
                    [f"http://127.0.0.1:{port}/gateway/gemini" + GEMINI_PLAIN for port in ports],
                    standin.gemini_url + GEMINI_PLAIN,
                    wire="gemini",
                    bare=bare + GEMINI_PLAIN,
                )
            except Exception as exc:
                traceback.print_exc()
                rows.append(_row(profile, "Gemini, 20 messages", f"failed: {exc}"[:300], ok=False))
            try:
                rows += _concurrent(profile, token, gateways)
            except Exception as exc:
                traceback.print_exc()
                rows.append(_row(profile, "8 concurrent clients", f"failed: {exc}"[:300], ok=False))
        if otel != "off":
            rows += _export_rows(profile, otel, collector)
        try:
            if only == "hot":
                raise _Skipped
            rows += _slow_path(
                profile,
                slow_size,
                slow_calls,
                token,
                gateways,
                direct,
                bare + "/v1",
                lite,
                [process.pid for process in processes[: len(ports)]],
            )
        except _Skipped:
            pass
        except Exception as exc:
            traceback.print_exc()
            rows.append(_row(profile, "slow path", f"failed: {exc}"[:300], ok=False))
    finally:
        if collector is not None:
            collector.close()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        standin.close()
        log.seek(0)
        tracebacks = log.read().decode("utf-8", "replace").count("Traceback")
        log.close()
    if otel != "off":
        where = "a local collector" if otel == "collector" else "a closed port"
        for one in rows:
            one["figure"] = f"{one['figure']} [OTLP export to {where}]"
    servers = f"{len(ports)} daphne" + (" + a Celery worker" if production else "")
    rows.append(
        _row(profile, f"tracebacks in the logs of {servers}", str(tracebacks), "0", not tracebacks)
    )
    return rows


class _Skipped(Exception):
    pass


class _OtlpReceiver:
    """A local OTLP/HTTP trace receiver: accepts POST /v1/traces (protobuf), counts the spans
    it decodes (opentelemetry-proto) and answers 200 with an empty export response."""

    def __init__(self) -> None:
        self.spans = 0
        self.posts = 0
        self._lock = threading.Lock()
        self._server: Any = None

    def start(self) -> _OtlpReceiver:
        import gzip
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                count = sum(
                    len(scope.spans)
                    for resource in request.resource_spans
                    for scope in resource.scope_spans
                )
                with receiver._lock:
                    receiver.posts += 1
                    receiver.spans += count
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _export_rows(profile: str, otel: str, collector: _OtlpReceiver | None) -> list[Row]:
    """What the export did: the spans the collector received (every gateway call's, once the
    batch processor's schedule has run), or with a dead collector, every call still answered
    and recorded."""
    from sessions_app.models import Call

    time.sleep(1)  # a call's row is stored just after its answer
    calls = Call.objects.count()
    answered = Call.objects.filter(status="ok").count()
    rows = [
        _row(
            profile,
            "gateway calls recorded / answered ok",
            f"{calls:,} / {answered:,}",
            "all ok",
            answered == calls,
        )
    ]
    if collector is not None:
        # The batch processor sends every 5 s (OTEL_BSP_SCHEDULE_DELAY): wait for the last.
        deadline = time.monotonic() + 30
        while collector.spans < calls and time.monotonic() < deadline:
            time.sleep(0.5)
        rows.append(
            _row(
                profile,
                "spans the collector received (POST /v1/traces requests)",
                f"{collector.spans:,} ({collector.posts:,})",
                f"≥ {calls:,} calls",
                collector.spans >= calls,
            )
        )
    return rows


def _timed_plain(client: Any, url: str, body: dict, headers: dict) -> float:
    started = time.perf_counter()
    response = client.post(url, json=body, headers=headers)
    response.read()
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text[:300]
    return elapsed * 1000


def _timed_first_chunk(client: Any, url: str, body: dict, headers: dict) -> float:
    started = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers) as response:
        assert response.status_code == 200
        first = None
        for _chunk in response.iter_raw():
            if first is None:
                first = time.perf_counter() - started
        return (first or 0.0) * 1000


def _body(wire: str, history: list[dict[str, str]]) -> dict[str, Any]:
    """A request carrying `history`: Chat Completions messages, Responses input items
    (role + content items are messages there too), or Gemini contents (the system message as
    its systemInstruction, the assistant's turns as the model's)."""
    if wire == "responses":
        return {"model": MODEL, "input": history, "store": False}
    if wire == "gemini":
        system = [m["content"] for m in history if m["role"] == "system"]
        body: dict[str, Any] = {
            "contents": [
                {
                    "role": "model" if m["role"] == "assistant" else "user",
                    "parts": [{"text": m["content"]}],
                }
                for m in history
                if m["role"] != "system"
            ]
        }
        if system:
            body["systemInstruction"] = {"parts": [{"text": "\n".join(system)}]}
        return body
    return {"model": MODEL, "messages": history}


def _latency(
    profile: str,
    sizes: tuple[int, ...],
    calls: int,
    token: str,
    gateways: list[str],
    direct: str,
    *,
    wire: str = "chat",
    bare: str | None = None,
    added: dict[tuple[str, str, int], float] | None = None,
) -> list[Row]:
    """Each call of each size sent direct, through the gateway and through the bare proxy,
    each going first in turn, the sizes interleaved call by call. "Added" is the median of
    each call's own difference (through minus the direct call sent beside it), which the
    load of the moment weighs on alike; p99 is the p99 through minus the p99 direct."""
    import httpx

    # Each wire's sessions apart (a Responses session is prepared anew).
    tag = "" if wire == "chat" else f"{wire}-"
    key = (
        {"x-goog-api-key": "bench-key"}
        if wire == "gemini"
        else {"Authorization": "Bearer sk-bench"}
    )
    auth = {**key, "X-Ledger-Key": token}
    rows: list[Row] = []
    histories: dict[tuple[int, int], list[dict[str, str]]] = {}
    results: dict[tuple[int, str], tuple[list[float], list[float], list[float]]] = {}
    with httpx.Client(timeout=60) as client:
        for size in sizes:
            base = _conversation(size - 1)
            # Prepare: one session per call holding the first N − 1 messages (not measured).
            for call in range(calls):
                headers = {**auth, "X-Ledger-Session": f"bench-{tag}{size}-{call}"}
                gateway = gateways[call % len(gateways)]
                _timed_plain(client, gateway, _body(wire, base), headers)
                # The call's conversation: the prepared N − 1 messages and the reply to them.
                histories[(size, call)] = base + [
                    {"role": "assistant", "content": f"Re: {base[-1]['content']}"}
                ]
        for mode in ("plain", "stream"):
            for size in sizes:
                results[(size, mode)] = ([], [], [])
            timer = _timed_plain if mode == "plain" else _timed_first_chunk
            for call in range(calls):
                order = sizes if call % 2 else tuple(reversed(sizes))
                for size in order:
                    through, straight, proxied = results[(size, mode)]
                    headers = {**auth, "X-Ledger-Session": f"bench-{tag}{size}-{call}"}
                    question = f"And {mode} {call}?"
                    history = histories[(size, call)] + [{"role": "user", "content": question}]
                    body = _body(wire, history)
                    if mode == "stream" and wire != "gemini":
                        body["stream"] = True
                    # Each session's calls go to the server processes in turn.
                    gateway = gateways[(call + (mode == "stream")) % len(gateways)]
                    plain_headers = dict(key)
                    turns = [(straight, direct, plain_headers), (through, gateway, headers)]
                    if bare is not None:
                        turns.append((proxied, bare, plain_headers))
                    if mode == "stream" and wire == "gemini":
                        # Gemini streams from its own method (SSE with alt=sse).
                        turns = [
                            (times, url.replace(GEMINI_PLAIN, GEMINI_STREAM), h)
                            for times, url, h in turns
                        ]
                    # Each in turn goes first: whoever follows the gateway shares the machine
                    # with the work it does after answering (the calls row, the usage push).
                    shift = call % len(turns)
                    for times, url, sent_headers in turns[shift:] + turns[:shift]:
                        times.append(timer(client, url, body, sent_headers))
                    histories[(size, call)] = history + [
                        {"role": "assistant", "content": f"Re: {question}"}
                    ]
    for (size, mode), (through, straight, proxied) in results.items():
        label = "full response" if mode == "plain" else "time to first chunk"
        if wire == "responses":
            label = f"Responses, {label}"
        elif wire == "gemini":
            label = f"Gemini, {label}"
        p50_added = statistics.median(t - d for t, d in zip(through, straight, strict=True))
        p99_added = _percentile(through, 0.99) - _percentile(straight, 0.99)
        if added is not None:
            added[(wire, mode, size)] = p50_added
        rows.append(
            _row(
                profile,
                f"{size} messages, {label}: direct p50 / p99",
                f"{statistics.median(straight):.1f} / {_percentile(straight, 0.99):.1f} ms",
            )
        )
        rows.append(
            _row(
                profile,
                f"{size} messages, {label}: through the gateway p50 / p99",
                f"{statistics.median(through):.1f} / {_percentile(through, 0.99):.1f} ms",
            )
        )
        targets = {"chat": TARGETS.get(size, (None, None)), "responses": RESPONSES_TARGETS}.get(
            wire, (None, None)
        )
        target = targets[mode == "stream"]
        rows.append(
            _row(
                profile,
                f"{size} messages, {label}: added p50 / p99 ({len(through)} calls)",
                f"{p50_added:.1f} / {p99_added:.1f} ms",
                f"p50 ≤ {target:.0f} ms" if target is not None else "—",
                p50_added <= target if target is not None else None,
            )
        )
        if proxied:
            bare_added = statistics.median(p - d for p, d in zip(proxied, straight, strict=True))
            if added is not None:
                added[("bare", mode, size)] = bare_added
            rows.append(
                _row(
                    profile,
                    f"{size} messages, {label}: a bare aiohttp proxy adds p50 / p99",
                    f"{bare_added:.1f} / "
                    f"{_percentile(proxied, 0.99) - _percentile(straight, 0.99):.1f} ms",
                )
            )
    # Rows by size, then mode, as before.
    position = {size: index for index, size in enumerate(sizes)}
    return sorted(rows, key=lambda row: position[int(str(row["figure"]).split(" ", 1)[0])])


def _growth(
    profile: str, added: dict[tuple[str, str, int], float], sizes: tuple[int, ...]
) -> list[Row]:
    """The added p50 at the largest conversation over that at the smallest: the gateway's
    beside the bare proxy's."""
    small, large = min(sizes), max(sizes)
    rows: list[Row] = []
    for mode in ("plain", "stream"):
        label = "full response" if mode == "plain" else "time to first chunk"
        ratios = {}
        for who in ("chat", "bare"):
            low, high = added.get((who, mode, small)), added.get((who, mode, large))
            if low is not None and high is not None:
                ratios[who] = (high / low if low > 0 else float("inf"), low, high)
        if "chat" not in ratios:
            continue
        ratio, low, high = ratios["chat"]
        value = f"{ratio:.2f}x ({low:.1f} → {high:.1f} ms)"
        if "bare" in ratios:
            b_ratio, b_low, b_high = ratios["bare"]
            value += f"; bare proxy {b_ratio:.2f}x ({b_low:.1f} → {b_high:.1f} ms)"
        rows.append(
            _row(
                profile,
                f"{label}, added p50 at {large} messages over {small}",
                value,
                f"≤ {GROWTH}x",
                ratio <= GROWTH,
            )
        )
    return rows


def _concurrent(profile: str, token: str, gateways: list[str]) -> list[Row]:
    import httpx

    from sessions_app.models import Call, Event, Session

    system = {"role": "system", "content": "You are a careful coding agent."}
    headers = {
        "Authorization": "Bearer sk-bench",
        "X-Ledger-Key": token,
        "X-Ledger-Session": "crowd",
    }
    errors: list[str] = []

    def client_thread(number: int) -> None:
        history = [system]
        with httpx.Client(timeout=60) as client:
            for turn in range(CALLS_PER_THREAD):
                history.append({"role": "user", "content": f"client {number} turn {turn}"})
                gateway = gateways[(number + turn) % len(gateways)]
                response = client.post(
                    gateway, json={"model": MODEL, "messages": history}, headers=headers
                )
                if response.status_code != 200:
                    errors.append(response.text[:200])
                    return
                history.append(response.json()["choices"][0]["message"])

    started = time.perf_counter()
    threads = [threading.Thread(target=client_thread, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    session = Session.objects.get(client_key="crowd")
    events = list(Event.objects.filter(session=session).values_list("type", "content"))
    users = [c for t, c in events if t == "USER_MESSAGE"]
    replies = [c for t, c in events if t == "AGENT_MESSAGE"]
    expected = THREADS * CALLS_PER_THREAD
    # Each call's row is written just after its response: give the last ones a moment.
    deadline = time.monotonic() + 5
    while (
        recorded := Call.objects.filter(session=session, status="ok").count()
    ) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    ok = (
        not errors
        and len(users) == len(set(users)) == expected
        and len(replies) == len(set(replies)) == expected
        and sum(1 for t, _ in events if t == "SYSTEM_PROMPT") == 1
        and recorded == expected
    )
    return [
        _row(
            profile,
            f"{THREADS} concurrent clients × {CALLS_PER_THREAD} calls on one session",
            f"{len(users)} user messages, {len(replies)} replies, {recorded} calls, "
            f"{len(events)} events ({expected} each expected; {len(errors)} errors; {elapsed:.1f} s)",
            "none lost, none duplicated",
            ok,
        )
    ]


# --- the slow path (issue 42): retries and edited histories ------------------------------------


def _tool_turn(index: int) -> list[dict[str, Any]]:
    """One step of a coding agent's loop: the user's ask, the assistant's tool call, its
    result, the assistant's words (four messages)."""
    call = f"call_{index:05d}"
    return [
        {"role": "user", "content": f"Step {index}: look at src/module_{index}.py again."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": f'{{"path": "src/module_{index}.py"}}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": call,
            "content": f"def handler_{index}(request):\n"
            + f"    value = request.config.get('timeout_{index}', 30)\n" * 6,
        },
        {"role": "assistant", "content": f"handler_{index} reads the timeout with a default now."},
    ]


def _tool_conversation(size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."}
    ]
    index = 0
    while len(messages) < size:
        messages += _tool_turn(index)
        index += 1
    return messages[:size]


def _cleared(history: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """`history` with every tool result but the newest `keep` cleared, as Claude Code's
    microcompaction clears old ones (a new list; the messages cleared are new objects)."""
    results = [i for i, m in enumerate(history) if m["role"] == "tool"]
    old = set(results[:-keep]) if keep else set(results)
    return [{**m, "content": CLEARED} if i in old else m for i, m in enumerate(history)]


# LiteLLM's proxy refuses to start without a master key; callers send it as their bearer token.
LITELLM_KEY = "sk-" + os.urandom(32).hex()


def _start_litellm(executable: str, upstream: str, processes: list, log: Any) -> str:
    """LiteLLM's proxy in front of the stand-in (its own venv: `executable`), no database,
    no network (the bundled model-cost map)."""
    port = _free_port()
    config = Path(tempfile.mkdtemp(prefix="bench-litellm-")) / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: gpt-4o\n"
        "    litellm_params:\n"
        "      model: openai/gpt-4o\n"
        f"      api_base: {upstream}\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOG": "ERROR",
    }
    processes.append(
        subprocess.Popen(
            [executable, "--config", str(config), "--port", str(port), "--num_workers", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    )
    return f"http://127.0.0.1:{port}"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settle(pids: list[int], *, at_most: float = 90.0) -> None:
    """Until the servers are idle (under 5% of a core for a second): what the preparation
    set off (search indexing of its messages) must not weigh on the measured calls."""
    deadline = time.monotonic() + at_most
    while time.monotonic() < deadline:
        before = [_cpu_seconds(pid) for pid in pids]
        time.sleep(1)
        if all(_cpu_seconds(pid) - was < 0.05 for pid, was in zip(pids, before, strict=True)):
            return


def _wait_http(url: str, *, deadline: float) -> None:
    import httpx

    while True:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _slow_path(
    profile: str,
    size: int,
    calls: int,
    token: str,
    gateways: list[str],
    direct: str,
    bare: str,
    litellm: str | None,
    servers: list[int] | None = None,
) -> list[Row]:
    """At `size` messages: the agent loop's next call, a retry of the call before, and the
    next call of a history whose old tool results were cleared meanwhile; each sent direct,
    through the gateway, the bare proxy and LiteLLM, in turn, interleaved call by call."""
    import httpx

    key = {"Authorization": "Bearer sk-bench"}
    workloads = ("loop", "retry", "edit")
    results: dict[tuple[str, str, str], list[float]] = {}
    base = _tool_conversation(size - 2)
    sent: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with httpx.Client(timeout=60) as client:
        # Prepare (unmeasured): each session holds the history as its client last sent it.
        for call in range(calls):
            for workload in workloads:
                history = _cleared(base, KEEP_RESULTS_BEFORE) if workload == "edit" else base
                headers = {
                    **key,
                    "X-Ledger-Key": token,
                    "X-Ledger-Session": f"slow-{workload}-{call}",
                }
                _timed_plain(
                    client, gateways[call % len(gateways)], _body("chat", history), headers
                )
                # The stand-in's reply echoes the last message (ECHO): the history the client
                # holds now, unless it retries the call it made.
                reply = {"role": "assistant", "content": f"Re: {history[-1]['content']}"}
                sent[(workload, call)] = history if workload == "retry" else [*history, reply]
        _settle(servers or [])
        for mode in ("plain", "stream"):
            timer = _timed_plain if mode == "plain" else _timed_first_chunk
            for call in range(calls):
                for workload in workloads:
                    history = sent[(workload, call)]
                    if workload == "retry":
                        body = _body("chat", history)  # the same body again
                    else:
                        ask = {"role": "user", "content": f"And {mode} {call}?"}
                        following = [*history, ask]
                        if workload == "edit":
                            following = _cleared(following, KEEP_RESULTS_AFTER)
                        body = _body("chat", following)
                        sent[(workload, call)] = following + [
                            {"role": "assistant", "content": f"Re: And {mode} {call}?"}
                        ]
                    if mode == "stream":
                        body["stream"] = True
                    headers = {
                        **key,
                        "X-Ledger-Key": token,
                        "X-Ledger-Session": f"slow-{workload}-{call}",
                    }
                    turns = [
                        ("direct", direct, key),
                        ("gateway", gateways[call % len(gateways)], headers),
                        ("bare proxy", bare + "/chat/completions", key),
                    ]
                    if litellm is not None:
                        turns.append(
                            (
                                "LiteLLM",
                                litellm + "/v1/chat/completions",
                                {"Authorization": f"Bearer {LITELLM_KEY}"},
                            )
                        )
                    shift = call % len(turns)
                    for who, url, sent_headers in turns[shift:] + turns[:shift]:
                        results.setdefault((mode, workload, who), []).append(
                            timer(client, url, body, sent_headers)
                        )
    rows: list[Row] = []
    for mode in ("plain", "stream"):
        label = "full response" if mode == "plain" else "time to first chunk"
        loop_added = None
        for workload in workloads:
            straight = results[(mode, workload, "direct")]
            for who in ("gateway", "bare proxy", "LiteLLM"):
                through = results.get((mode, workload, who))
                if not through:
                    continue
                added = statistics.median(t - d for t, d in zip(through, straight, strict=True))
                p99 = _percentile(through, 0.99) - _percentile(straight, 0.99)
                target, ok = "—", None
                if who == "gateway" and workload == "loop":
                    loop_added = added
                elif who == "gateway" and loop_added is not None:
                    bound = SLOW_RATIO * max(loop_added, 1.0)
                    target, ok = f"p50 ≤ {bound:.1f} ms ({SLOW_RATIO}x the loop)", added <= bound
                rows.append(
                    _row(
                        profile,
                        f"slow path, {size} messages, {label}, {workload}: {who} adds p50 / p99 "
                        f"({len(through)} calls)",
                        f"{added:.1f} / {p99:.1f} ms",
                        target,
                        ok,
                    )
                )
    return rows


# --- the bare proxy -------------------------------------------------------------------------


def _bare_proxy(port: int, upstream: str) -> None:
    """An aiohttp server that forwards every request's bytes to `upstream` with one pooled
    client session and relays the answer (streamed as it arrives): no parsing, no records."""
    import asyncio

    import aiohttp
    from aiohttp import web

    dropped = {"host", "content-length", "transfer-encoding", "connection"}

    async def main() -> None:
        client = aiohttp.ClientSession()

        async def relay(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
            query = "?" + request.query_string if request.query_string else ""
            async with client.request(
                request.method,
                upstream + "/" + request.match_info["rest"] + query,
                data=body,
                headers=headers,
            ) as answer:
                kind = answer.headers.get("content-type", "application/json")
                if not kind.startswith("text/event-stream"):
                    data = await answer.read()
                    return web.Response(
                        body=data,
                        status=answer.status,
                        content_type=None,
                        headers={"Content-Type": kind},
                    )
                out = web.StreamResponse(status=answer.status, headers={"Content-Type": kind})
                await out.prepare(request)
                async for chunk in answer.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{rest:.*}", relay)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


# --- parent -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Gateway benchmark (issue 10).")
    parser.add_argument("--profile", choices=["embedded", "postgres", "both"], default="both")
    parser.add_argument("--calls", type=int, default=300, help="measured calls per figure")
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, SIZES)),
        help="conversation sizes in messages, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--known-body-bytes",
        type=int,
        default=KNOWN_BYTES,
        help="the servers' LEDGER_GATEWAY_KNOWN_BODY_BYTES (default: room for every "
        "conversation; 0 reads every body whole)",
    )
    parser.add_argument("--slow-size", type=int, default=1600, help="the slow path's size")
    parser.add_argument("--slow-calls", type=int, default=150, help="calls per slow-path figure")
    parser.add_argument("--litellm", default="", help="a LiteLLM proxy executable to compare")
    parser.add_argument(
        "--only",
        choices=["slow", "hot"],
        default="",
        help="only the slow path, or only the conversation sizes",
    )
    parser.add_argument(
        "--otel",
        choices=["off", "collector", "dead"],
        default="off",
        help="export spans over OTLP/HTTP to a local receiver, or to a closed port",
    )
    parser.add_argument("--child", choices=["embedded", "postgres"], help=argparse.SUPPRESS)
    parser.add_argument("--bare-proxy", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = tuple(int(size) for size in args.sizes.split(","))
    if args.bare_proxy:
        _bare_proxy(int(args.bare_proxy[0]), args.bare_proxy[1].rstrip("/"))
        return 0
    if args.child:
        emit(
            _child(
                args.child,
                args.calls,
                sizes,
                args.known_body_bytes,
                slow_size=args.slow_size,
                slow_calls=args.slow_calls,
                litellm=args.litellm,
                only=args.only,
                otel=args.otel,
            )
        )
        return 0
    return run_profiles(
        "Gateway benchmark",
        profile=args.profile,
        script=__file__,
        args=[
            "--calls",
            str(args.calls),
            "--sizes",
            args.sizes,
            "--known-body-bytes",
            str(args.known_body_bytes),
            "--slow-size",
            str(args.slow_size),
            "--slow-calls",
            str(args.slow_calls),
            *(["--litellm", args.litellm] if args.litellm else []),
            *(["--only", args.only] if args.only else []),
            "--otel",
            args.otel,
        ],
        pg_db=PG_DB,
        timeout=1800,
        postgres_env={
            "REDIS_URL": "redis://127.0.0.1:6379/0",
            "CHANNELS_PREFIX": f"bench-gateway-{os.getpid()}",
            "CELERY_QUEUE": f"bench-gateway-{os.getpid()}",
        },
    )


if __name__ == "__main__":
    raise SystemExit(main())
