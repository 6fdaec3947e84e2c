"""`manage.py check --deploy --fail-level WARNING` passes with the production variables set
(as .ci/run runs it), and the hardening settings follow their environment variables."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.profile_independent

ROOT = Path(__file__).resolve().parents[2]

PRODUCTION = {
    "DATABASE_URL": "postgres://ledger@db.invalid/ledger",
    "REDIS_URL": "redis://redis.invalid:6379/0",
    "DJANGO_ALLOWED_HOSTS": "ledger.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://ledger.example.com",
}
HARDENING = {
    "DJANGO_SECURE_SSL_REDIRECT": "true",
    "DJANGO_SECURE_HSTS_SECONDS": "31536000",
    "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "DJANGO_SECURE_HSTS_PRELOAD": "true",
    "DJANGO_SESSION_COOKIE_SECURE": "true",
    "DJANGO_CSRF_COOKIE_SECURE": "true",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "true",
}


def _manage(*args: str, extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "DATABASE_", "REDIS_", "PYTEST_"))
    }
    env.update(PRODUCTION, DJANGO_SECRET_KEY=secrets.token_urlsafe(50), **extra)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_passes_the_deploy_check_with_the_production_variables():
    result = _manage("check", "--deploy", "--fail-level", "WARNING", extra=HARDENING)
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_warns_in_the_deploy_check_without_them():
    result = _manage("check", "--deploy", "--fail-level", "WARNING", extra={})
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in output


def test_it_trusts_the_proxy_header_and_marks_cookies_secure_when_told():
    script = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.SECURE_PROXY_SSL_HEADER, s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS]))"
    )
    result = _manage("shell", "-c", script, extra=HARDENING)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == (
        '[["HTTP_X_FORWARDED_PROTO", "https"], true, true, true, 31536000]'
    )
