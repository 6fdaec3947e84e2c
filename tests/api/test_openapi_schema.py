"""The OpenAPI schema matches the API: every documented operation answered for real and each
response validated against the schema (deterministic), then schemathesis on a bounded number
of generated cases per operation, valid (positive) and invalid (negative) ones: no server
error, invalid input refused with a 4xx, every response as documented."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.api_rules import within_documented_rules


def generated_schema() -> dict[str, Any]:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def documented_operations() -> list[tuple[str, str]]:
    """(METHOD, path) of every operation in the generated schema."""
    return [
        (method.upper(), path)
        for path, item in generated_schema()["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]


def operations_with_input() -> list[tuple[str, str]]:
    """The operations that take a body or query parameters: the ones invalid input can be
    generated for (a path id is any string)."""
    paths = generated_schema()["paths"]
    return [
        (method, path)
        for method, path in documented_operations()
        if "requestBody" in paths[path][method.lower()]
        or any(p["in"] == "query" for p in paths[path][method.lower()].get("parameters", []))
    ]


class LedgerWSGIApp:
    """The project's WSGI application as the tests call it: a request here must not end with
    close_old_connections, which would close the test's transaction (Django's test client
    unhooks it the same way, per request)."""

    def __init__(self) -> None:
        from django.core.wsgi import get_wsgi_application

        self.app = get_wsgi_application()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        from django.core.signals import request_finished, request_started
        from django.db import close_old_connections

        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            response = self.app(environ, start_response)
            try:
                return [b"".join(response)]
            finally:
                response.close()
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)


@pytest.fixture
def api_schema(db):
    """The generated OpenAPI schema, loaded by schemathesis and bound to the WSGI app."""
    import schemathesis

    # Its own configuration: the repository's schemathesis.toml (and its hooks, which read a
    # live server) is for `st run` (tests/api/test_openapi_live.py).
    loaded = schemathesis.openapi.from_dict(generated_schema(), config=schemathesis.Config())
    loaded.app = LedgerWSGIApp()
    return loaded


@dataclass
class World:
    headers: dict[str, str]
    ids: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def ledger_world(alice, alice_api) -> World:
    from rest_framework.authtoken.models import Token

    session = alice_api.post(
        "/api/v1/sessions",
        {"model": "gpt-4o", "systemPrompt": "You are terse.", "settings": {"autoCompact": False}},
        format="json",
    ).json()["id"]
    events: Any = alice_api.post(
        f"/api/v1/sessions/{session}/events",
        [
            {"type": "USER_MESSAGE", "content": "List the files."},
            {"type": "AGENT_MESSAGE", "content": "a.py b.py"},
        ],
        format="json",
    ).json()
    run = alice_api.post(
        f"/api/v1/sessions/{session}/compactions", {"strategy": "trim"}, format="json"
    ).json()
    token = Token.objects.get(user=alice).key
    return World(
        headers={"Authorization": f"Token {token}"},
        ids={"session_id": session, "event_id": events[0]["id"], "compaction_id": run["id"]},
    )


# --- every documented operation, answered for real ---------------------------------------------


class Walk:
    """Calls the API through the WSGI app and validates each response against the schema,
    recording which (METHOD, path template, status) were seen."""

    def __init__(self, schema: Any, token: str) -> None:
        from werkzeug.test import Client

        self.schema = schema
        self.client = Client(schema.app)
        self.auth = {"Authorization": f"Token {token}"}
        self.seen: set[tuple[str, str, int]] = set()

    def __call__(
        self,
        method: str,
        template: str,
        status: int,
        *,
        ids: dict[str, str] | None = None,
        body: Any = None,
        raw: str | None = None,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
        mimetype: str = "application/json",
    ) -> Any:
        path = template.format(**(ids or {}))
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        response = self.client.open(
            path,
            method=method,
            data=data,
            query_string=query,
            headers=self.auth if headers is None else headers,
            content_type=content_type if data is not None else None,
        )
        assert response.status_code == status, (method, path, response.get_data(as_text=True))
        if status != 204:
            assert response.mimetype == mimetype
        self.schema[template][method].validate_response(response)
        self.seen.add((method, template, status))
        return response.get_json(silent=True)


# The error statuses the walk checks are documented on the operation that answered them.
CHECKED_ERRORS = (400, 401, 404, 406, 409, 413, 422)


def test_it_documents_every_response_of_every_operation(api_schema, alice, settings):
    from rest_framework.authtoken.models import Token

    from compaction_app.models import CompactionRun

    walk = Walk(api_schema, Token.objects.get_or_create(user=alice)[0].key)
    V = "/api/v1"
    S = V + "/sessions/{session_id}"

    # The API root (public: links only; a token that is sent is checked all the same).
    walk("GET", V + "/", 200, headers={})
    walk("GET", V + "/", 401, headers={"Authorization": "Token not-a-token"})
    # Every operation answers JSON (the calls lists also CSV and NDJSON, on request: below).
    walk("GET", V + "/", 406, headers={"Accept": "text/html"})
    walk("GET", V + "/models", 406, headers={**walk.auth, "Accept": "application/xml"})

    # Sessions.
    session = walk(
        "POST", V + "/sessions", 201, body={"model": "gpt-4o", "systemPrompt": "Be terse."}
    )
    ids = {"session_id": session["id"]}
    walk("POST", V + "/sessions", 400, body={"model": "no-such-model"})
    walk("POST", V + "/sessions", 400, body={"model": "gpt-4o", "settings": False})
    walk(
        "POST",
        V + "/sessions",
        400,
        raw='{"model":"gpt-4o","settings":' + "[" * 200 + "]" * 200 + "}",
    )
    walk("POST", V + "/sessions", 415, raw="model=gpt-4o", content_type="text/plain")
    walk("POST", V + "/sessions", 401, body={"model": "gpt-4o"}, headers={})
    walk("GET", V + "/sessions", 200)
    walk("GET", V + "/sessions", 400, query={"page": "first"})
    walk("GET", V + "/sessions", 404, query={"page": "99"})
    walk("GET", S, 200, ids=ids)
    walk("GET", S, 404, ids={"session_id": str(uuid.uuid4())})
    walk("PATCH", S, 200, ids=ids, body={"title": "walk"})
    walk("PATCH", S, 400, ids=ids, body={"settings": {"strategy": "nope"}})

    # Events.
    single = walk(
        "POST",
        S + "/events",
        201,
        ids=ids,
        body={"id": str(uuid.uuid4()), "type": "USER_MESSAGE", "content": "hi"},
    )
    walk(
        "POST",
        S + "/events",
        200,
        ids=ids,
        body={"id": single["id"], "type": "USER_MESSAGE", "content": "hi"},
    )
    walk(
        "POST",
        S + "/events",
        409,
        ids=ids,
        body={"id": single["id"], "type": "USER_MESSAGE", "content": "ho"},
    )
    walk(
        "POST",
        S + "/events",
        201,
        ids=ids,
        body=[{"type": "AGENT_MESSAGE", "content": "x", "tokenUsage": {"totalTokens": 10**12}}]
        * 1000,
    )
    walk(
        "POST",
        S + "/events",
        422,
        ids=ids,
        body={"type": "AGENT_MESSAGE", "content": "y", "tokenUsage": {"totalTokens": 10**12}},
    )
    walk("POST", S + "/events", 400, ids=ids, body={"type": ["USER_MESSAGE"], "content": "x"})
    walk(
        "POST",
        S + "/events",
        400,
        ids=ids,
        body={"id": False, "type": "USER_MESSAGE", "content": "x"},
    )
    settings.API_MAX_BODY_BYTES = 1024
    walk("POST", S + "/events", 413, ids=ids, body={"type": "USER_MESSAGE", "content": "z" * 2000})
    settings.API_MAX_BODY_BYTES = 32 * 1024 * 1024
    walk("GET", S + "/events", 200, ids=ids, query={"after": "0", "limit": "2"})
    walk("GET", S + "/events", 400, ids=ids, query={"limit": "0"})
    event_ids = {**ids, "event_id": single["id"]}
    walk("GET", S + "/events/{event_id}", 200, ids=event_ids)
    walk("GET", S + "/events/{event_id}", 404, ids={**ids, "event_id": str(uuid.uuid4())})
    walk("PATCH", S + "/events/{event_id}", 200, ids=event_ids, body={"pinned": True})
    walk("PATCH", S + "/events/{event_id}", 400, ids=event_ids, body={"pinned": "yes"})
    walk("GET", S + "/usage", 200, ids=ids)
    walk("GET", S + "/threads", 200, ids=ids)
    walk("GET", S + "/usage", 404, ids=ids, query={"thread": "no-such-thread"})
    walk("GET", S + "/threads", 404, ids={"session_id": str(uuid.uuid4())})
    walk("GET", S + "/events", 200, ids=ids, query={"thread": "main"})
    walk("GET", S + "/events", 400, ids=ids, query={"thread": ""})
    walk("GET", S + "/context", 200, ids=ids, query={"format": "anthropic"})
    walk("GET", S + "/context", 400, ids=ids, query={"format": "gemini"})

    # Compactions: a dry run, a queued run, a conflicting one; /compact on another session.
    walk("POST", S + "/compactions", 200, ids=ids, body={"strategy": "trim", "dryRun": True})
    walk("POST", S + "/compactions", 400, ids=ids, body={"strategy": "nope"})
    run = walk("POST", S + "/compactions", 202, ids=ids, body={"strategy": "trim"})
    walk("POST", S + "/compactions", 409, ids=ids, body={})
    walk("GET", S + "/compactions", 200, ids=ids)
    run_ids = {"compaction_id": run["id"]}
    walk("GET", V + "/compactions/{compaction_id}", 200, ids=run_ids)
    walk("GET", V + "/compactions/{compaction_id}", 404, ids={"compaction_id": str(uuid.uuid4())})
    walk("POST", V + "/compactions/{compaction_id}/revert", 409, ids=run_ids)
    walk("GET", S + "/summary", 404, ids=ids)
    other = walk(
        "POST", V + "/sessions", 201, body={"model": "gpt-4o", "systemPrompt": "Be terse."}
    )
    walk(
        "POST",
        S + "/events",
        202,
        ids={"session_id": other["id"]},
        body={"type": "USER_MESSAGE", "content": "/compact trim"},
    )

    # A session at its hard limit: /context compacts synchronously (summary, a revertible run).
    full = walk(
        "POST",
        V + "/sessions",
        201,
        body={
            "model": "gpt-4o",
            "contextLimit": 600,
            "systemPrompt": "Be terse.",
            "settings": {"autoCompact": False},
        },
    )
    full_ids = {"session_id": full["id"]}
    walk(
        "POST",
        S + "/events",
        201,
        ids=full_ids,
        body=[
            {
                "type": "USER_MESSAGE" if i % 2 else "AGENT_MESSAGE",
                "content": f"turn {i}: " + "words " * 60,
            }
            for i in range(9)
        ],
    )
    usage = walk("GET", S + "/usage", 200, ids=full_ids)
    assert usage["atLimit"], json.dumps(usage)
    assert walk("GET", S + "/context", 200, ids=full_ids)["compactionRecommended"]
    context = walk("POST", S + "/context", 200, ids=full_ids)
    assert context["compaction"]["status"] == "completed"
    walk("GET", S + "/summary", 200, ids=full_ids)
    walk(
        "POST",
        V + "/compactions/{compaction_id}/revert",
        200,
        ids={"compaction_id": context["compaction"]["id"]},
    )
    # Too small a window for even the system prompt and last message.
    tiny = walk(
        "POST",
        V + "/sessions",
        201,
        body={"model": "gpt-4o", "contextLimit": 5, "systemPrompt": "A long system prompt " * 5},
    )
    walk("GET", S + "/context", 422, ids={"session_id": tiny["id"]})

    # Search and recall.
    walk("GET", S + "/search", 200, ids=full_ids, query={"q": "turn"})
    walk("GET", S + "/search", 400, ids=full_ids, query={"q": "turn", "limit": "0"})
    walk("GET", V + "/search", 200, query={"q": "turn"})
    walk("GET", V + "/search", 400, query={})
    walk("POST", S + "/recall", 200, ids=full_ids, body={"query": "turn", "maxTokens": 200})
    walk("POST", S + "/recall", 400, ids=full_ids, body={"query": "turn", "seqs": [1]})
    walk("POST", S + "/recall", 400, ids=full_ids, body={"query": 0})
    walk("POST", S + "/recall", 404, ids={"session_id": str(uuid.uuid4())}, body={"seqs": [1]})

    # Gateway calls (none here: the pages and their summaries are empty).
    walk("GET", S + "/calls", 200, ids=full_ids, query={"status": "ok,timeout"})
    walk("GET", S + "/calls", 400, ids=full_ids, query={"status": "fine"})
    walk("GET", S + "/calls", 404, ids={"session_id": str(uuid.uuid4())})
    walk("GET", V + "/calls", 200, query={"since": "2026-01-01T00:00:00Z"})
    walk("GET", V + "/calls", 400, query={"since": "yesterday"})
    walk("GET", V + "/calls", 404, query={"page": "99"})
    walk("GET", V + "/calls", 403, query={"user": str(alice.pk)})  # staff only

    # A recorded call: its story, and the calls streamed as CSV or NDJSON (not a page).
    from django.utils import timezone

    from sessions_app.calls import call_record

    call = call_record(
        session_id=full["id"],
        owner_id=alice.pk,
        started_at=timezone.now(),
        wire="openai",
        status="ok",
        model_requested="gpt-4o",
        model_served="gpt-4o",
        http_status=200,
        prompt_tokens=120,
        completion_tokens=30,
        ttfb_ms=40,
        total_ms=90,
    )
    walk("GET", V + "/calls/{call_id}", 200, ids={"call_id": str(call.pk)})
    walk("GET", V + "/calls/{call_id}", 404, ids={"call_id": str(uuid.uuid4())})
    walk("GET", V + "/calls", 200, query={"export": "csv"}, mimetype="text/csv")
    walk(
        "GET",
        V + "/calls",
        200,
        headers={**walk.auth, "Accept": "application/x-ndjson"},
        mimetype="application/x-ndjson",
    )
    walk("GET", V + "/calls", 400, query={"export": "csv", "pageSize": "0"})
    walk("GET", V + "/calls", 406, headers={**walk.auth, "Accept": "text/html"})

    # Usage over time, in a time zone of the viewer's.
    over_time = walk(
        "GET", V + "/usage/calls", 200, query={"tz": "Asia/Kathmandu", "groupBy": "model"}
    )
    assert over_time["totals"]["calls"] == 1, over_time
    walk("GET", V + "/usage/calls", 400, query={"tz": "Mars/Olympus"})
    walk("GET", V + "/usage/calls", 404, query={"session": str(uuid.uuid4())})
    walk("GET", V + "/usage/calls", 403, query={"user": str(alice.pk)})  # staff only
    from sessions_app.usage_over_time import MAX_PERIODS
    from tests.support.api_rules import USAGE_MAX_PERIODS

    assert USAGE_MAX_PERIODS == MAX_PERIODS  # the generated cases' rule, the API's bound

    # Budgets: a user reads their own; only staff set them (403 here).
    from sessions_app.budgets import budget_create

    budget = budget_create(user=alice, period="day", limit_usd="1")
    budget_ids = {"budget_id": str(budget.pk)}
    walk("GET", V + "/budgets", 200)
    walk("GET", V + "/budgets", 404, query={"page": "99"})
    walk("POST", V + "/budgets", 403, body={"user": "alice", "period": "day", "limitUsd": 1})
    walk("GET", V + "/budgets/{budget_id}", 200, ids=budget_ids)
    walk("GET", V + "/budgets/{budget_id}", 404, ids={"budget_id": str(uuid.uuid4())})
    walk("PATCH", V + "/budgets/{budget_id}", 403, ids=budget_ids, body={"limitUsd": 2})
    walk("DELETE", V + "/budgets/{budget_id}", 403, ids=budget_ids)

    walk("POST", V + "/tokens/count", 200, body={"model": "gpt-4o", "text": "hello"})
    walk("POST", V + "/tokens/count", 400, body={"model": "gpt-4o"})
    walk("GET", V + "/models", 200)
    walk("DELETE", S, 204, ids={"session_id": other["id"]})
    walk("DELETE", S, 404, ids={"session_id": other["id"]})
    from django.core.cache import cache

    settings.API_THROTTLE_RATE = "1/min"
    cache.clear()
    walk("GET", V + "/models", 200)
    walk("GET", V + "/models", 429)

    assert CompactionRun.objects.filter(pk=run["id"]).exists()
    seen = {(method, template) for method, template, _ in walk.seen}
    assert seen == set(documented_operations()), "a documented operation is not exercised here"
    documented_errors = {
        (method, path, int(status))
        for path, item in generated_schema()["paths"].items()
        for method_lower, operation in item.items()
        for method in [method_lower.upper()]
        for status in operation["responses"]
        if int(status) in CHECKED_ERRORS
    }
    assert {key for key in walk.seen if key[2] in CHECKED_ERRORS} <= documented_errors


# --- generated cases ---------------------------------------------------------------------------

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# Per operation and mode: a dozen draws each keeps the ~60 runs at about half a minute on
# PostgreSQL. The live walk (test_openapi_live.py) adds its coverage phase's boundary cases.
EXAMPLES = 12
CASES = [(method, path, GenerationMode.POSITIVE) for method, path in documented_operations()] + [
    (method, path, GenerationMode.NEGATIVE) for method, path in operations_with_input()
]


class DatabaseState:
    """The rules' StoredState (tests/support/api_rules.py), read from the test database."""

    @staticmethod
    def _session(session_id: str) -> Any:
        from django.core.exceptions import ValidationError

        from sessions_app.models import Session

        try:
            return Session.objects.filter(pk=session_id).first()
        except (ValueError, ValidationError):  # a made-up id: a 404 whatever the body
            return None

    def stored_settings(self, session_id: str) -> dict[str, Any] | None:
        session = self._session(session_id)
        return None if session is None else dict(session.settings or {})

    def context_limit(self, session_id: str) -> int | None:
        session = self._session(session_id)
        return None if session is None else session.context_limit

    def has_thread(self, session_id: str, key: str) -> bool | None:
        from sessions_app.models import Thread

        if self._session(session_id) is None:
            return None
        return Thread.objects.filter(session_id=session_id, key=key).exists()


def _within_documented_rules(case: Any) -> bool:
    """A valid generated case keeps the rules its schema cannot state (api_rules)."""
    body = getattr(case, "body", None)
    return within_documented_rules(
        method=case.method,
        path=case.path,
        body=body if isinstance(body, dict | list | str) else None,
        path_parameters=case.path_parameters,
        state=DatabaseState(),
        query=case.query,
    )


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_it_answers_generated_requests_as_documented(api_schema, ledger_world, method, path, mode):
    operation = api_schema[path][method]
    real_ids = {name: value for name, value in ledger_world.ids.items() if f"{{{name}}}" in path}
    # Mostly real objects (else nearly every case is a 404), sometimes made-up ids.
    strategy = st.one_of(
        operation.as_strategy(mode, path_parameters=real_ids) if real_ids else st.nothing(),
        operation.as_strategy(mode),
    )

    if mode == GenerationMode.POSITIVE:
        strategy = strategy.filter(_within_documented_rules)

    @given(case=strategy)
    @hypothesis_settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case):
        case.call_and_validate(headers=ledger_world.headers, checks=checks)

    # Reads and writes: a request the schema allows is accepted (every bound the API
    # enforces is in the schema). /context's 422 (a window too small for the messages that
    # must be sent) is an answer about the session, not a refusal of the request.
    checks = CHECKS
    if not path.endswith("/context"):
        checks = [*CHECKS, positive_data_acceptance]

    run()
