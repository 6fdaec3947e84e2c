"""`manage.py serve`: everything a newcomer needs on one machine.

Migrates, makes a demo staff user and prints its API token (embedded profile only, or with
`--demo-user`: a production deployment starts with no known credentials), starts the embedded
Celery worker thread (unless a broker is configured), then serves HTTP and websockets with daphne.
While it serves, its process id is in VAR_DIR/serve.pid: `manage.py serve --stop` stops that
server (the README's first-five-minutes block restarts it against the provider stand-in)
without a broad `pkill` that would hit every other server on the machine.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Migrate, create the demo user, start the embedded worker and serve the app."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--no-demo-user", action="store_true", help="Do not create the demo user."
        )
        parser.add_argument(
            "--demo-user",
            action="store_true",
            help="Create the demo user (demo / demo) even on the production profile.",
        )
        parser.add_argument(
            "--check", action="store_true", help="Do the set-up, print it, and exit."
        )
        parser.add_argument(
            "--stop",
            action="store_true",
            help="Stop the server a `serve` of this VAR_DIR started, if one runs, and exit.",
        )

    def handle(
        self,
        *args: Any,
        host: str,
        port: int,
        no_demo_user: bool,
        demo_user: bool = False,
        check: bool,
        stop: bool = False,
        **options: Any,
    ) -> None:
        if stop:
            self.stdout.write(stop_previous(pid_file()))
            return
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(self.style.SUCCESS("Database migrated."))
        # A well-known password on a reachable server is a backdoor: only the embedded
        # (single-machine) profile gets the demo user unless it is asked for explicitly.
        production = bool(settings.DATABASE_URL or settings.REDIS_URL)
        if production and not demo_user:
            self.stdout.write(
                "Production profile: no demo user. Create an admin with "
                "`python manage.py createsuperuser`, then an API token in the admin "
                "(Auth Token → Tokens) or with `python manage.py drf_create_token <username>`."
            )
        elif demo_user or not no_demo_user:
            user, created = get_user_model().objects.get_or_create(
                username="demo", defaults={"is_staff": True, "is_superuser": True}
            )
            if created:
                user.set_password("demo")
                user.save()
            token, _ = Token.objects.get_or_create(user=user)
            self.stdout.write(
                f"Demo user: demo / demo (staff)\nAPI token: {token.key}\n"
                f"  curl -H 'Authorization: Token {token.key}' http://{host}:{port}/api/v1/models"
            )
        if check:
            return
        # Daphne finds a busy port only once it runs, after "Serving on" was printed (and the
        # embedded worker started): a newcomer read that the server was up.
        _check_port_free(host, port)
        if settings.EMBEDDED_WORKER:
            from compaction_app.embedded_worker import start_embedded_worker
            from compaction_app.sweeper import start_embedded_sweeper
            from config.celery import app

            start_embedded_worker(app)
            # No beat process here: a timer thread frees runs orphaned by a restart (their
            # tasks died with the previous process's in-memory broker).
            start_embedded_sweeper()
            self.stdout.write(
                "Celery worker: embedded thread (in-memory broker), stale-run sweeper every "
                f"{settings.COMPACTION_SWEEP_SECONDS:g} s."
            )
        else:
            self.stdout.write(
                "Celery worker: external — run `celery -A config worker` and "
                "`celery -A config beat` (the stale-run sweeper)."
            )
        self.stdout.write(
            self.style.SUCCESS(f"Serving on http://{host}:{port}/ (dashboard) and /api/v1/docs/")
        )
        from compaction_app.http_server import run

        pids = pid_file()
        # The production profile keeps no SQLite file, so nothing else made VAR_DIR: a fresh
        # clone's first `serve` creates it.
        pids.parent.mkdir(parents=True, exist_ok=True)
        pids.write_text(f"{os.getpid()}\n")
        try:
            # Daphne with deadlines on slow request bodies and idle connections (see there).
            run(host=host, port=port)
        finally:
            if pids.exists() and pids.read_text().strip() == str(os.getpid()):
                pids.unlink()


def pid_file() -> Path:
    return Path(settings.VAR_DIR) / "serve.pid"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A pid the system reused for another program is not ours to stop (Linux tells).
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():
        try:
            return b"serve" in cmdline.read_bytes()
        except OSError:
            return False
    return True


def stop_previous(pids: Path, *, wait: float = 15.0) -> str:
    """Stop the server whose id `pids` holds (SIGTERM, then wait for it to go); a missing
    file or a process already gone is nothing to stop."""
    try:
        pid = int(pids.read_text().strip())
    except (FileNotFoundError, ValueError):
        return "No server of this checkout is running."
    if pid == os.getpid() or not _running(pid):
        pids.unlink(missing_ok=True)
        return "No server of this checkout is running."
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running(pid):
        raise CommandError(f"the server (pid {pid}) did not stop within {wait:g} s")
    pids.unlink(missing_ok=True)
    return f"Stopped the server (pid {pid})."


def _check_port_free(host: str, port: int) -> None:
    """Refuse to start when `host:port` cannot be listened on (another server holds it).
    SO_REUSEADDR, as the server sets it: a port whose last connections are still closing
    (TIME_WAIT) is free to it, and only a listening socket makes this fail."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise CommandError(f"cannot serve on {host}:{port}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
            probe.listen(1)
        except OSError as exc:
            raise CommandError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc}"
                " (is another server running? choose another one with --port)"
            ) from None
