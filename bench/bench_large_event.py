"""One large event appended through the REST API: time and peak memory per request.

    python bench/bench_large_event.py [--sizes 1,8,31]

Each size runs in its own child process (a fresh interpreter, the embedded profile's SQLite in
a throwaway directory) that posts one USER_MESSAGE of that many MB of prose-like text through
the API (Django's test client: the full request path, parsers, validation, token counting and
the append) and prints the wall time and the peak of Python allocations (tracemalloc) during
the request, as a multiple of the body. The target (issue 22, row 14): at most 3× the body,
time linear in the size. tracemalloc sees Python's allocations, not SQLite's page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from child_env import child_env  # noqa: E402


def child(megabytes: int) -> dict[str, float]:
    import random
    import time
    import tracemalloc

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(username="alice")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    session = client.post(
        "/api/v1/sessions", {"model": "gpt-4o", "contextLimit": 100_000_000}, format="json"
    ).json()["id"]
    rng = random.Random(14)
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)
    ]
    text = " ".join(rng.choices(words, k=megabytes * 1_000_000 // 6))[: megabytes * 1_000_000]
    body = json.dumps({"type": "USER_MESSAGE", "content": text}).encode()
    del text
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    response = client.generic(
        "POST", f"/api/v1/sessions/{session}/events", body, content_type="application/json"
    )
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    if os.environ.get("BENCH_TRACE"):
        _trace_peak(client, session, body)
    assert response.status_code == 201, response.content[:300]
    return {"mb": megabytes, "body": len(body), "seconds": elapsed, "peak": peak}


def _trace_peak(client, session: str, body: bytes) -> None:
    """BENCH_TRACE=1: the allocation sites alive at the request's peak, to stderr."""
    import tracemalloc

    holder: list = []
    tracemalloc.start(25)

    import sessions_app.append as append_module

    original = append_module.append_prepared

    def spy(**kwargs):  # the moment the engine starts: parsed body and counts are alive
        holder.append(tracemalloc.take_snapshot())
        return original(**kwargs)

    append_module.append_prepared = spy
    import sessions_app.services as services_module

    services_module.append_prepared = spy
    client.generic(
        "POST", f"/api/v1/sessions/{session}/events", body, content_type="application/json"
    )
    tracemalloc.stop()
    for stat in holder[0].statistics("traceback")[:6]:
        print(f"{stat.size / 1e6:8.1f} MB", file=sys.stderr)
        for line in stat.traceback.format()[-8:]:
            print("    " + line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,31")
    parser.add_argument("--child", type=int)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    print(f"{'size':>6} {'seconds':>8} {'s/MB':>6} {'peak MB':>8} {'peak/body':>9}")
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as var_dir:
            env = child_env(var_dir=Path(var_dir))
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            out = subprocess.run(  # noqa: S603 - this script, again
                [sys.executable, __file__, "--child", str(size)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{row['mb']:>4} MB {row['seconds']:>8.2f} {row['seconds'] / row['mb']:>6.2f} "
            f"{row['peak'] / 1e6:>8.0f} {row['peak'] / row['body']:>8.1f}×"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
