"""`/metrics` scraped by a real Prometheus server (Debian's `prometheus`) from the production
profile: two daphne processes on PostgreSQL and Redis and a Celery worker. Calls made through
either process are counted once, the same by both (the numbers come from the shared ledger),
websockets open on both are summed, a compaction the worker ran is counted; Prometheus'
query API gives them back. /metrics refuses anyone but the scraper's token or staff.

Needs `DATABASE_URL` (PostgreSQL), `REDIS_URL` and /usr/bin/prometheus; skipped otherwise
(CI installs prometheus and runs the production profile)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest
from django.conf import settings
from websockets.sync.client import connect

from compaction_app.testkit.provider_standin import ProviderStandIn, Step
from sessions_app.models import Call
from tests.support.celery_workers import worker_pool
from tests.support.daphne import daphne_process, production_env
from tests.support.helpers import api_token, closed_port, stop_process, wait_listening

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SECRET = "scrape-secret-for-tests"

pytestmark = [
    pytest.mark.skipif(
        not (settings.REDIS_URL and os.environ.get("DATABASE_URL")),
        reason="needs the production profile (DATABASE_URL and REDIS_URL)",
    ),
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs prometheus (apt-get)"),
    pytest.mark.django_db(transaction=True),
]


def _query(base: str, expression: str) -> list[dict]:
    answer = httpx.get(f"{base}/api/v1/query", params={"query": expression}, timeout=10).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _wait(base: str, expression: str, predicate, timeout: float = 30):
    deadline = time.monotonic() + timeout
    result: list[dict] = []
    while time.monotonic() < deadline:
        result = _query(base, expression)
        if predicate(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{expression}: {result}")


def test_it_is_scraped_by_prometheus_across_two_processes_and_a_worker(
    alice, staff, alice_api, tmp_path
):
    alice_key = api_token(alice)
    with (
        ProviderStandIn() as upstream,
        worker_pool(settings=settings, tmp_path=tmp_path, queue_suffix="metrics", env={}) as pool,
    ):
        pool.start("metrics-worker", "--concurrency", "1")
        env = {
            **production_env(
                LEDGER_OPENAI_UPSTREAM=upstream.openai_url,
                METRICS_TOKEN=SECRET,
                API_THROTTLE_RATE="off",
            ),
            "CELERY_QUEUE": pool.env["CELERY_QUEUE"],
        }
        with daphne_process(env) as first, daphne_process(env) as second:
            ports = (first, second)
            # /metrics: the scraper's token or staff only.
            url = f"http://127.0.0.1:{first}/metrics"
            assert httpx.get(url).status_code == 401
            assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
            bad = httpx.get(url, headers={"Authorization": f"Token {alice_key}"})
            assert bad.status_code == 403
            staff_read = httpx.get(url, headers={"Authorization": f"Token {api_token(staff)}"})
            assert staff_read.status_code == 200

            # Three calls through one process, two through the other (one the provider refuses).
            for port, count in ((first, 3), (second, 2)):
                client = openai.OpenAI(
                    api_key="sk-test",
                    base_url=f"http://127.0.0.1:{port}/gateway/openai/v1",
                    default_headers={"X-Ledger-Key": alice_key, "X-Ledger-Session": "metrics"},
                    max_retries=0,
                )
                for n in range(count):
                    if port == second and n == 1:
                        upstream.script(Step(kind="error", status=400, message="bad request"))
                        with pytest.raises(openai.BadRequestError):
                            client.chat.completions.create(
                                model="gpt-4o", messages=[{"role": "user", "content": "x"}]
                            )
                        continue
                    upstream.script(Step(text="ok", prompt_tokens=40, cache_read_tokens=10))
                    client.chat.completions.create(
                        model="gpt-4o", messages=[{"role": "user", "content": f"call {port} {n}"}]
                    )
            deadline = time.monotonic() + 20
            while Call.objects.count() < 5 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert Call.objects.count() == 5

            # A compaction the worker runs.
            session = alice_api.post("/api/v1/sessions", {"model": "gpt-4o"}, format="json").json()[
                "id"
            ]
            events = [
                {"type": t, "content": f"turn {n}: fixed /srv/app/f{n}.py " * 20}
                for n in range(6)
                for t in ("USER_MESSAGE", "AGENT_MESSAGE")
            ]
            alice_api.post(f"/api/v1/sessions/{session}/events", events, format="json")
            httpx.post(
                f"http://127.0.0.1:{second}/api/v1/sessions/{session}/compactions",
                json={},
                headers={"Authorization": f"Token {alice_key}"},
            ).raise_for_status()

            # A websocket open on each process.
            sockets = [
                connect(f"ws://127.0.0.1:{port}/ws/sessions/?token={alice_key}") for port in ports
            ]
            prom_port = closed_port()
            config = tmp_path / "prometheus.yml"
            config.write_text(
                json.dumps(
                    {
                        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                        "scrape_configs": [
                            {
                                "job_name": "ledger",
                                "authorization": {"credentials": SECRET},
                                "static_configs": [
                                    {"targets": [f"127.0.0.1:{port}" for port in ports]}
                                ],
                            }
                        ],
                    }
                )
            )
            prometheus = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                wait_listening(prom_port, prometheus, what="prometheus", seconds=30)
                base = f"http://127.0.0.1:{prom_port}"
                up = _wait(
                    base, "up", lambda r: len(r) == 2 and all(x["value"][1] == "1" for x in r)
                )
                assert {x["metric"]["instance"] for x in up} == {f"127.0.0.1:{p}" for p in ports}
                # Both processes give the same totals: the ledger's own.
                calls = _wait(
                    base,
                    'sum by (instance, status) (ledger_gateway_calls_total{model="gpt-4o"})',
                    lambda r: len(r) == 4,
                )
                by = {
                    (x["metric"]["instance"], x["metric"]["status"]): x["value"][1] for x in calls
                }
                for port in ports:
                    assert by[(f"127.0.0.1:{port}", "ok")] == "4"
                    assert by[(f"127.0.0.1:{port}", "provider_error")] == "1"
                here = f'instance="127.0.0.1:{first}"'
                tokens = _query(
                    base,
                    'ledger_gateway_tokens_total{kind="cache_read",' + here + "}",
                )
                assert tokens[0]["value"][1] == "40"
                added = _query(
                    base,
                    "ledger_gateway_added_latency_seconds_count{" + here + "}",
                )
                assert added[0]["value"][1] == "5"
                quantile = _query(
                    base,
                    "histogram_quantile(0.5, ledger_gateway_call_duration_seconds_bucket{"
                    + here
                    + "})",
                )
                assert float(quantile[0]["value"][1]) > 0
                _wait(
                    base,
                    'ledger_compactions_total{trigger="manual",outcome="completed"}',
                    lambda r: len(r) == 2 and all(x["value"][1] == "1" for x in r),
                )
                _wait(
                    base,
                    "ledger_websocket_connections",
                    lambda r: len(r) == 2 and all(x["value"][1] == "2" for x in r),
                )
                depth = _query(base, "ledger_celery_queue_depth")
                assert len(depth) == 2 and all(float(x["value"][1]) >= 0 for x in depth)
                assert _query(base, "ledger_compaction_stale_runs")[0]["value"][1] == "0"
            finally:
                for ws in sockets:
                    ws.close()
                stop_process(prometheus)
