"""What the gateway's known bodies cost a server in resident memory (issue 42, row 7).

A server (`manage.py serve`'s, LedgerServer, on the embedded profile) is started with the
provider stand-in as its upstream; `--conversations` conversations (100) each send one accepted
body of about `--body-mb` MB (1) of a given shape; the server's resident memory (VmRSS) is read
before, after the bodies, and once more after a pause. The red team saw 853 -> 2,428 MB with
the budget counting the bodies' bytes (64 MiB): about 23x what it counted, held for the 10-minute
idle window. The budget now counts what a body takes once parsed (body.parsed_cost).

    .venv/bin/python bench/bench_known_bodies.py [--conversations 100] [--body-mb 1]
        [--shape parts|agent] [--budget BYTES]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from child_env import child_env  # noqa: E402

_SERVE = (
    "import os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
    "import django; django.setup(); from compaction_app.http_server import run; "
    "run(host='127.0.0.1', port=int(sys.argv[1]))"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _body(shape: str, size: int, number: int) -> dict[str, Any]:
    """About `size` bytes of messages: `parts`, user turns of two-letter text parts (the
    costliest shape a chat body holds once parsed, about 11x its bytes); `agent`, a coding
    agent's turns (about 2.5x)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"Conversation {number}."}]
    written = 0
    turn = 0
    while written < size:
        if shape == "parts":
            message: dict[str, Any] = {
                "role": "user",
                "content": [{"type": "text", "text": "ab"} for _ in range(200)],
            }
            written += 200 * 27
        else:
            text = f"Step {turn}: the KeyError in handler_{turn} comes back; run the tests. " * 3
            message = {"role": "user" if turn % 2 == 0 else "assistant", "content": text}
            written += len(text) + 40
        messages.append(message)
        turn += 1
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Go on."})
    return {"model": "gpt-4o", "messages": messages}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--body-mb", type=float, default=1.0)
    parser.add_argument("--shape", choices=["parts", "agent"], default="parts")
    parser.add_argument("--budget", type=int, default=None, help="LEDGER_GATEWAY_KNOWN_BODY_BYTES")
    args = parser.parse_args()

    import django

    var_dir = Path(tempfile.mkdtemp(prefix="bench_known_bodies_"))
    env = child_env(var_dir=var_dir)
    os.environ.update(VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="config.settings")
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    django.setup()
    import httpx
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from compaction_app.testkit.provider_standin import ProviderStandIn, Step

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(username="bench", password="bench-password")
    token = Token.objects.create(user=user).key
    standin = ProviderStandIn(default=Step(text="ok", prompt_tokens=10)).start()
    standin.keep_requests = False
    env = {**env, "LEDGER_OPENAI_UPSTREAM": standin.openai_url}
    if args.budget is not None:
        env["LEDGER_GATEWAY_KNOWN_BODY_BYTES"] = str(args.budget)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/gateway/openai/v1/chat/completions"
    size = int(args.body_mb * 1_000_000)
    try:
        deadline = time.monotonic() + 60
        headers = {"Authorization": "Bearer sk-bench", "X-Ledger-Key": token}
        with httpx.Client(timeout=120) as client:
            while True:
                try:
                    client.get(f"http://127.0.0.1:{port}/gateway/openai/v1/models", headers=headers)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            # Warm: one small call, so the process has loaded what every call needs.
            warm = _body("agent", 2_000, -1)
            client.post(url, json=warm, headers={**headers, "X-Ledger-Session": "warm"})
            time.sleep(2)
            before = _rss_mb(server.pid)
            sent = 0
            started = time.perf_counter()
            for number in range(args.conversations):
                body = _body(args.shape, size, number)
                raw = client.build_request("POST", url, json=body).content
                sent += len(raw)
                answer = client.post(
                    url, json=body, headers={**headers, "X-Ledger-Session": f"c{number}"}
                )
                assert answer.status_code == 200, answer.text[:300]
            took = time.perf_counter() - started
            after = _rss_mb(server.pid)
            time.sleep(5)
            settled = _rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=20)
        standin.close()
        shutil.rmtree(var_dir, ignore_errors=True)
    budget = args.budget if args.budget is not None else "default"
    print(
        f"bench_known_bodies — {args.conversations} conversations, one accepted body each of "
        f"{sent / args.conversations / 1e6:.2f} MB ({args.shape}), budget {budget}, "
        f"{took:.0f} s, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}\n"
    )
    print("| resident memory | MB |")
    print("|---|---|")
    print(f"| before | {before:.0f} |")
    print(f"| after the bodies | {after:.0f} (+{after - before:.0f}) |")
    print(f"| 5 s later | {settled:.0f} (+{settled - before:.0f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
