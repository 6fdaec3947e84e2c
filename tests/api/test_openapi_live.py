"""schemathesis's own command line, `st run`, against a live server with every default check
(server errors, undocumented statuses, response schemas and headers, valid data accepted,
invalid data refused, authentication, stateful links): the schema the server publishes
describes what it answers. `st run` reads the repository's schemathesis.toml, as it does from
the repository's root (docs/api.md, "Checking the schema").

The walk runs on the production profile (`.ci/run`'s PostgreSQL + Redis pass): a daphne
process on this run's database and Redis, where the database's own limits (NUL in text, the
range of its integers) can answer differently from SQLite. On the embedded profile the
in-process generated cases (tests/api/test_openapi_schema.py) make the same checks, and the
README's test command does not repeat them over HTTP: the walk is the suite's single most
expensive test. `LEDGER_LIVE_SCHEMA_WALK=1` runs it there too, against a child server of its
own (tests/support/live_ledger.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
# Fixed draws (deterministic generation; the seed is for a rerun without it) and a bounded
# number per operation; the coverage phase's boundary cases (every listed model among them)
# come on top.
ST_OPTIONS = ["--seed", "1", "--generation-deterministic", "--max-examples", "10", "--workers", "1"]
RUN_SECONDS = 300


@pytest.fixture
def live_api(request) -> Iterator[tuple[str, str]]:
    """A live server's base URL and an API token of alice's."""
    if not os.environ.get("DATABASE_URL"):
        from tests.support.live_ledger import live_ledger

        with live_ledger() as live:
            yield live.base_url, live.tokens["alice"]
        return
    from tests.support.daphne import daphne_process, production_env
    from tests.support.helpers import api_token

    alice = request.getfixturevalue("alice")
    env = production_env(API_THROTTLE_RATE="off")
    with daphne_process(env) as port:
        yield f"http://127.0.0.1:{port}", api_token(alice)


def st_run(base_url: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SCHEMATHESIS_HOOKS", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{base_url}/api/v1/schema/",
            "-H",
            f"Authorization: Token {token}",
            *ST_OPTIONS,
            "--no-color",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )


def _report(output: str) -> str:
    """The run's phases, the failures' headlines and the summary (a failing case's body can
    run to megabytes)."""
    lines = [line[:300] for line in output.splitlines()]
    failures = next((i for i, line in enumerate(lines) if "= FAILURES =" in line), len(lines))
    return "\n".join(lines[:failures] + [line for line in lines[failures:] if line.strip()][-400:])


@pytest.mark.timeout(RUN_SECONDS + 60)
@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL") and not os.environ.get("LEDGER_LIVE_SCHEMA_WALK"),
    reason="the walk runs on the production profile (set LEDGER_LIVE_SCHEMA_WALK=1 to run it here)",
)
# On the production profile the server's process reads alice's token: committed, not held in
# the test's transaction.
@pytest.mark.django_db(transaction=True)
def test_it_passes_every_default_schemathesis_check_against_a_live_server(live_api):
    base_url, token = live_api
    paths = requests.get(f"{base_url}/api/v1/schema/?format=json", timeout=30).json()["paths"]
    operations = sum(
        method in ("get", "post", "put", "patch", "delete")
        for item in paths.values()
        for method in item
    )
    completed = st_run(base_url, token)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, _report(output)
    # The repository's configuration (its hooks and per-operation settings) was read.
    assert str(ROOT / "schemathesis.toml") in output, _report(output)
    assert re.search(rf"Selected: {operations}/{operations}\s+Tested: {operations}\b", output), (
        _report(output)
    )
    cases = re.search(r"(\d+) generated, (\d+) passed", output)
    assert cases is not None and cases.group(1) == cases.group(2), _report(output)
