"""Every page carries a Content-Security-Policy: default-src 'self', and no inline script
runs unless it carries the response's nonce. (The browser check that the dashboard, the API
docs and the admin work under it is tests/dashboard/test_csp_browser.py.)"""

from __future__ import annotations

import re

import pytest
from django.test import Client

from sessions_app.models import Session
from tests.dashboard.test_dashboard_views import make_session

pytestmark = pytest.mark.django_db

SCRIPT = re.compile(r"<script\b([^>]*)>", re.IGNORECASE)


def _policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    directives = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            directives[words[0]] = words[1:]
    return directives


def _check_page(response) -> None:
    assert response.status_code == 200, response.status_code
    policy = _policy(response)
    assert policy["default-src"] == ["'self'"]
    scripts = policy.get("script-src", policy["default-src"])
    assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
    nonces = [word[len("'nonce-") : -1] for word in scripts if word.startswith("'nonce-")]
    for attributes in SCRIPT.findall(response.content.decode()):
        if "src=" in attributes:
            continue
        # An inline script runs only with this response's nonce.
        match = re.search(r'nonce="([^"]+)"', attributes)
        assert match and match.group(1) in nonces, attributes


def test_it_sends_a_csp_on_the_dashboard_pages(alice):
    session = make_session(alice)
    browser = Client()
    browser.force_login(alice)
    for path in ("/", f"/sessions/{session.pk}/", f"/sessions/{session.pk}/search/?q=x"):
        _check_page(browser.get(path))


def test_it_sends_a_csp_on_the_login_page_and_the_api_docs():
    anonymous = Client()
    _check_page(anonymous.get("/accounts/login/"))
    _check_page(anonymous.get("/api/v1/docs/"))
    # The docs' own script is a file of this origin, not an inline block.
    script = anonymous.get("/api/v1/docs/?script=")
    assert script.status_code == 200 and "SwaggerUIBundle" in script.content.decode()


def test_it_sends_a_csp_on_the_admin(staff, alice):
    staff.is_superuser = True
    staff.save()
    session = make_session(alice)
    admin = Client()
    admin.force_login(staff)
    for path in (
        "/admin/",
        "/admin/sessions_app/session/",
        f"/admin/sessions_app/session/{session.pk}/change/",
        "/admin/auth/user/add/",
    ):
        _check_page(admin.get(path))
    assert Session.objects.filter(pk=session.pk).exists()
