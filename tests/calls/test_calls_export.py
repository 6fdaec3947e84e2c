"""Finding and taking out calls: sorting on every column, text search (model, session title,
error), session and user filters (user: staff only), and `Accept: text/csv` /
`application/x-ndjson` streaming every filtered row (formula-looking cells kept as text)."""

from __future__ import annotations

import csv
import datetime
import io
import json

import pytest
from django.test import Client
from django.utils import timezone

from sessions_app.calls import SORTS, call_record
from sessions_app.services import session_create

pytestmark = pytest.mark.django_db

NOW = timezone.now()


def _seed(alice, bob):
    billing = session_create(owner=alice, model="gpt-4o", title="Billing refactor")
    docs = session_create(owner=alice, model="gpt-4o", title="Docs pass")
    theirs = session_create(owner=bob, model="gpt-4o", title="Bob's session")
    rows = [
        (billing, "gpt-4o", "ok", "", 120, 30),
        (billing, "gpt-4o-mini", "provider_error", "=HYPERLINK(rate limited)", 800, None),
        (docs, "claude-3.5-sonnet", "ok", "", 450, 90),
        (theirs, "gpt-4o", "ok", "", 60, 10),
    ]
    for n, (session, model, status, error, total, completion) in enumerate(rows):
        call_record(
            session_id=session.pk,
            owner_id=session.owner_id,
            started_at=NOW - datetime.timedelta(minutes=n),
            wire="openai",
            status=status,
            model_requested=model,
            model_served=model,
            error=error,
            prompt_tokens=100 * (n + 1) if completion else None,
            completion_tokens=completion,
            total_ms=total,
            ttfb_ms=total // 2,
        )
    return billing, docs, theirs


def test_it_sorts_on_every_column_both_ways(alice, bob, alice_api):
    _seed(alice, bob)
    for key in SORTS:
        for sort in (key, "-" + key):
            answer = alice_api.get("/api/v1/calls", {"sort": sort})
            assert answer.status_code == 200, sort
            assert answer.json()["count"] == 3
    totals = [
        c["totalMs"] for c in alice_api.get("/api/v1/calls", {"sort": "total"}).json()["results"]
    ]
    assert totals == sorted(totals)
    costs = [
        c["costUsd"] for c in alice_api.get("/api/v1/calls", {"sort": "-cost"}).json()["results"]
    ]
    assert costs[-1] is None  # no cost sorts last
    assert alice_api.get("/api/v1/calls", {"sort": "colour"}).status_code == 400


def test_it_searches_model_title_and_error_and_filters_session_and_user(
    alice, bob, alice_api, staff
):
    billing, docs, theirs = _seed(alice, bob)

    def found(**q):
        return [c["modelRequested"] for c in alice_api.get("/api/v1/calls", q).json()["results"]]  # noqa: E731

    assert found(q="claude") == ["claude-3.5-sonnet"]
    assert sorted(found(q="billing")) == ["gpt-4o", "gpt-4o-mini"]
    assert found(q="rate limited") == ["gpt-4o-mini"]
    assert found(session=str(docs.pk)) == ["claude-3.5-sonnet"]
    # Another user's session: 404, as everywhere.
    assert alice_api.get("/api/v1/calls", {"session": str(theirs.pk)}).status_code == 404
    # Another user's calls: staff only (403 permission_denied); a malformed user id is 400.
    refused = alice_api.get("/api/v1/calls", {"user": str(bob.pk)})
    assert (refused.status_code, refused.json()["error"]) == (403, "permission_denied")
    assert alice_api.get("/api/v1/calls", {"user": ""}).status_code == 400
    client = Client()
    client.force_login(staff)
    staff_rows = client.get("/api/v1/calls", {"user": str(bob.pk)}).json()["results"]
    assert [c["sessionId"] for c in staff_rows] == [str(theirs.pk)]


def test_it_streams_every_filtered_row_as_csv_and_ndjson(alice, bob, alice_api):
    _seed(alice, bob)
    answer = alice_api.get("/api/v1/calls", {"page_size": 1}, HTTP_ACCEPT="text/csv")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    assert answer.streaming
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    assert len(rows) == 3  # every row, not a page
    error = next(r for r in rows if r["status"] == "provider_error")
    assert error["error"] == "'=HYPERLINK(rate limited)"
    assert {r["modelRequested"] for r in rows} == {"gpt-4o", "gpt-4o-mini", "claude-3.5-sonnet"}
    ndjson = alice_api.get("/api/v1/calls", {"q": "gpt"}, HTTP_ACCEPT="application/x-ndjson")
    lines = b"".join(ndjson.streaming_content).decode().splitlines()
    assert [json.loads(line)["modelRequested"] for line in lines] == ["gpt-4o", "gpt-4o-mini"]
    exported = alice_api.get("/api/v1/calls", {"export": "csv", "sort": "total"})
    body = b"".join(exported.streaming_content).decode().splitlines()
    assert len(body) == 4 and body[0].startswith("id,sessionId,startedAt")


def test_the_dashboard_table_sorts_searches_and_links_its_csv(alice, bob):
    _seed(alice, bob)
    client = Client()
    client.force_login(alice)
    page = client.get("/calls/", {"sort": "-total", "q": "gpt"}).content.decode()
    assert 'aria-sort="descending"' in page and "gpt-4o-mini" in page
    assert "claude-3.5-sonnet" not in page
    assert "/api/v1/calls?" in page and "export=csv" in page
    assert client.get("/calls/", {"sort": "colour"}).status_code == 400
    assert client.get("/calls/", {"user": str(bob.pk)}).status_code == 400
