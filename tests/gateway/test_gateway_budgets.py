"""Budgets: a spend limit per user (and per gateway client key) over a period, set by staff
(API, dashboard, admin); a call past it gets the provider's own 429 with a clear message and
nothing forwarded; alerts at 80 % and 100 %; counted in the database so that concurrent calls
— in one process or two — never spend more than the limit plus one call."""

from __future__ import annotations

import datetime
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import anthropic
import openai
import pytest
from django.conf import settings
from django.test import Client

from compaction_app.gateway import after
from compaction_app.testkit.provider_standin import Step
from sessions_app import budgets, pricing
from sessions_app.models import Budget, BudgetPeriod, Call, Event, Session
from tests.support.gateway_live import CANARY, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

# Each call the stand-in answers costs 1,000 prompt tokens and 1 output token on gpt-4o:
# $0.0025 + $0.00001.
CALL_NANO = pricing.price_call(
    "gpt-4o", pricing.CallUsage(input_tokens=1000, output_tokens=1)
).nano_usd
assert CALL_NANO == 2_510_000


def _ask(client, text: str = "Hi") -> object:
    return client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": text}], max_tokens=16
    )


# --- the API ------------------------------------------------------------------------------------


def test_it_lets_staff_set_budgets_and_users_read_their_own(
    staff_api, alice_api, bob_api, alice, bob
):
    made = staff_api.post(
        "/api/v1/budgets",
        {"user": "alice", "period": "day", "limitUsd": 5},
        format="json",
    )
    assert made.status_code == 201, made.content
    budget = made.json()
    assert budget["user"] == "alice" and budget["clientKey"] is None
    assert (budget["limitUsd"], budget["spentUsd"], budget["exceeded"]) == (5.0, 0.0, False)
    assert budget["periodEnd"] > budget["periodStart"]
    keyed = staff_api.post(
        "/api/v1/budgets",
        {"user": "alice", "clientKey": "agent-a", "period": "week", "limitUsd": 1.5},
        format="json",
    ).json()
    # The owner reads them; others do not see them; only staff change them.
    assert {b["id"] for b in alice_api.get("/api/v1/budgets").json()["results"]} == {
        budget["id"],
        keyed["id"],
    }
    assert bob_api.get("/api/v1/budgets").json()["results"] == []
    assert bob_api.get(f"/api/v1/budgets/{budget['id']}").status_code == 404
    denied = alice_api.post(
        "/api/v1/budgets", {"user": "alice", "period": "day", "limitUsd": 99}, format="json"
    )
    assert denied.status_code == 403 and denied.json()["error"] == "permission_denied"
    assert (
        alice_api.patch(
            f"/api/v1/budgets/{budget['id']}", {"limitUsd": 99}, format="json"
        ).status_code
        == 403
    )
    changed = staff_api.patch(
        f"/api/v1/budgets/{budget['id']}", {"limitUsd": 7.25, "period": "month"}, format="json"
    ).json()
    assert (changed["limitUsd"], changed["period"]) == (7.25, "month")
    # Bad input: 400 with the field; a second budget for the same key: 409.
    for bad in (
        {"user": "alice", "period": "year", "limitUsd": 1},
        {"user": "alice", "period": "day", "limitUsd": 0},
        {"user": "nobody", "period": "day", "limitUsd": 1},
        {"user": "alice", "period": "day", "limitUsd": 1, "extra": True},
    ):
        answer = staff_api.post("/api/v1/budgets", bad, format="json")
        assert answer.status_code == 400, (bad, answer.content)
    again = staff_api.post(
        "/api/v1/budgets", {"user": "alice", "period": "day", "limitUsd": 1}, format="json"
    )
    assert again.status_code == 409 and again.json()["error"] == "budget_exists"
    assert staff_api.delete(f"/api/v1/budgets/{keyed['id']}").status_code == 204
    assert Budget.objects.filter(user=alice).count() == 1


# --- the gateway --------------------------------------------------------------------------------


def test_it_refuses_a_call_past_the_budget_in_the_providers_429_and_alerts_at_80_and_100(
    gateway_url, upstream, alice, caplog
):
    caplog.set_level(logging.WARNING, logger="context")
    upstream.default = Step(text="ok", prompt_tokens=1000)
    # Four calls reach 80 % (4 × $0.00251 ≥ $0.0096), the fifth 100 %.
    budgets.budget_create(user=alice, period=BudgetPeriod.DAY, limit_usd="0.012")
    client = openai_client(gateway_url, key=token_for(alice), session="budgeted")
    for _ in range(4):
        _ask(client)
    after.wait_idle()
    alerts = [r for r in caplog.records if r.getMessage().startswith("budget_threshold")]
    assert [r.percent for r in alerts] == [80]
    _ask(client)  # spent $0.00753 + this one's estimate fit: the fifth passes the limit
    after.wait_idle()
    alerts = [r for r in caplog.records if r.getMessage().startswith("budget_threshold")]
    assert [r.percent for r in alerts] == [80, 100]
    forwarded = len(upstream.requests)
    session = Session.objects.get(client_key="budgeted")
    events = Event.objects.filter(session=session).count()
    with pytest.raises(openai.RateLimitError) as refused:
        _ask(client, "One more?")
    error = refused.value.body
    assert error["code"] == "budget_exceeded" and error["type"] == "insufficient_quota"
    assert "Budget exceeded" in error["message"] and "not forwarded" in error["message"]
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert int(refused.value.response.headers["Retry-After"]) > 0
    # Nothing forwarded, nothing of the refused call recorded but its call row.
    assert len(upstream.requests) == forwarded
    assert Event.objects.filter(session=session).count() == events
    after.wait_idle()
    refused_row = Call.objects.filter(session=session).order_by("started_at").last()
    assert (refused_row.status, refused_row.http_status, refused_row.error_code) == (
        "refused",
        429,
        "budget_exceeded",
    )
    spent = Budget.objects.get(user=alice).spent_nano_usd
    assert spent == 5 * CALL_NANO  # past the limit by less than one call
    assert spent - Decimal("0.012") * 10**9 < CALL_NANO


def test_it_answers_anthropics_shape_and_the_sdk_does_not_retry(gateway_url, upstream, alice):
    budget = budgets.budget_create(user=alice, period=BudgetPeriod.DAY, limit_usd="0.001")
    Budget.objects.filter(pk=budget.pk).update(spent_nano_usd=10**6)  # spent already
    client = anthropic.Anthropic(
        api_key=CANARY,
        base_url=f"{gateway_url}/gateway/anthropic",
        default_headers={"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "claude-spent"},
        max_retries=2,
    )
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(
            model="claude-3.5-sonnet", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    body = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert body["error"]["code"] == "budget_exceeded"
    assert upstream.requests == []
    after.wait_idle()
    # x-should-retry: false — the SDK asked once, not three times.
    assert Call.objects.filter(session__client_key="claude-spent").count() == 1


def test_it_limits_one_client_key_without_stopping_the_users_other_agents(
    gateway_url, upstream, alice
):
    upstream.default = Step(text="ok", prompt_tokens=1000)
    budgets.budget_create(
        user=alice, client_key="agent-a", period=BudgetPeriod.DAY, limit_usd="0.002"
    )
    agent_a = openai_client(gateway_url, key=token_for(alice), session="agent-a")
    agent_b = openai_client(gateway_url, key=token_for(alice), session="agent-b")
    _ask(agent_a)  # the one call that may pass the limit
    after.wait_idle()
    with pytest.raises(openai.RateLimitError):
        _ask(agent_a)
    _ask(agent_b)
    _ask(agent_b)


def test_it_starts_counting_again_in_the_next_period(alice):
    budget = budgets.budget_create(user=alice, period=BudgetPeriod.WEEK, limit_usd="1")
    monday = budgets.period_start(
        BudgetPeriod.WEEK, datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)
    )
    assert monday == datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC)
    Budget.objects.filter(pk=budget.pk).update(
        period_start=monday, spent_nano_usd=2 * 10**9, alerted_80=True, alerted_100=True
    )
    budget.refresh_from_db()
    assert budgets.budget_exhausted(budgets=[budget], now=monday + datetime.timedelta(days=3))
    later = monday + datetime.timedelta(days=7, hours=1)
    assert budgets.budget_exhausted(budgets=[budget], now=later) is None
    held = budgets.budget_reserve(budgets=[budget], estimate=10**6, now=later)
    assert isinstance(held, budgets.Reservation)
    budgets.budget_settle(reservation=held, actual=5 * 10**5, now=later)
    budget.refresh_from_db()
    assert budget.period_start == monday + datetime.timedelta(days=7)
    assert (budget.spent_nano_usd, budget.reserved_nano_usd, budget.in_flight) == (5 * 10**5, 0, 0)
    assert not budget.alerted_80 and not budget.alerted_100
    december = datetime.datetime(2026, 12, 31, 23, 59, tzinfo=datetime.UTC)
    month = budgets.period_start(BudgetPeriod.MONTH, december)
    assert month == datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    assert budgets.period_end(BudgetPeriod.MONTH, month) == datetime.datetime(
        2027, 1, 1, tzinfo=datetime.UTC
    )


def test_it_lets_reservations_of_a_dead_process_lapse(alice):
    budget = budgets.budget_create(user=alice, period=BudgetPeriod.DAY, limit_usd="0.01")
    now = datetime.datetime.now(datetime.UTC)
    long_ago = now - budgets.RESERVATION_LAPSE - datetime.timedelta(minutes=1)
    Budget.objects.filter(pk=budget.pk).update(
        reserved_nano_usd=10**7, in_flight=3, reserved_at=long_ago
    )
    budget.refresh_from_db()
    held = budgets.budget_reserve(budgets=[budget], estimate=10**6, now=now)
    assert isinstance(held, budgets.Reservation)
    budget.refresh_from_db()
    assert (budget.reserved_nano_usd, budget.in_flight) == (10**6, 1)


# --- concurrency ----------------------------------------------------------------------------------

# Each concurrent call: 200 prompt tokens and 1 output token ($0.00051); its reservation (its
# few tokens and max_tokens=100 at gpt-4o's rates) is at least that.
CONCURRENT_NANO = pricing.price_call(
    "gpt-4o", pricing.CallUsage(input_tokens=200, output_tokens=1)
).nano_usd
LIMIT_USD = "0.01"


def _hammer(urls: list[str], key: str, calls: int = 48, workers: int = 12) -> tuple[int, int]:
    """Concurrent calls spread over `urls`; (answered, refused)."""
    answered = refused = 0
    lock = threading.Lock()

    def one(number: int) -> None:
        nonlocal answered, refused
        client = openai.OpenAI(
            api_key=CANARY,
            base_url=f"{urls[number % len(urls)]}/gateway/openai/v1",
            default_headers={"X-Ledger-Key": key, "X-Ledger-Session": f"worker-{number % 6}"},
            max_retries=0,
            timeout=60,
        )
        try:
            client.chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": f"Task {number}"}],
                max_tokens=100,
            )
            outcome = "ok"
        except openai.RateLimitError:
            outcome = "refused"
        with lock:
            if outcome == "ok":
                answered += 1
            else:
                refused += 1

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, range(calls)))
    return answered, refused


def _assert_bounded(user) -> None:
    budget = Budget.objects.get(user=user)
    limit = Decimal(LIMIT_USD) * 10**9
    priced = sum(c.cost_nano_usd or 0 for c in Call.objects.filter(session__owner=user))
    assert budget.spent_nano_usd == priced
    print(
        f"budget: spent ${budget.spent_nano_usd / 10**9:.6f} of ${LIMIT_USD} "
        f"(one call ${CONCURRENT_NANO / 10**9:.6f})"
    )
    assert budget.spent_nano_usd <= limit + CONCURRENT_NANO
    assert (budget.reserved_nano_usd, budget.in_flight) == (0, 0)


def test_it_holds_the_limit_under_concurrent_calls(gateway_url, upstream, alice):
    upstream.default = Step(text="ok", prompt_tokens=200)
    budgets.budget_create(user=alice, period=BudgetPeriod.DAY, limit_usd=LIMIT_USD)
    answered, refused = _hammer([gateway_url], token_for(alice))
    after.wait_idle()
    print(f"one process: {answered} answered, {refused} refused")
    assert refused > 0 and answered > 0
    _assert_bounded(alice)


@pytest.mark.skipif(
    not (settings.REDIS_URL and os.environ.get("DATABASE_URL")),
    reason="needs the production profile (DATABASE_URL and REDIS_URL)",
)
def test_it_holds_the_limit_across_two_server_processes(upstream, alice):
    from tests.support.daphne import daphne_process, production_env

    upstream.default = Step(text="ok", prompt_tokens=200)
    budgets.budget_create(user=alice, period=BudgetPeriod.DAY, limit_usd=LIMIT_USD)
    env = production_env(
        LEDGER_OPENAI_UPSTREAM=upstream.openai_url, API_THROTTLE_RATE="off", EMBEDDED_WORKER="0"
    )
    with daphne_process(env) as first, daphne_process(env) as second:
        urls = [f"http://127.0.0.1:{first}", f"http://127.0.0.1:{second}"]
        answered, refused = _hammer(urls, token_for(alice))
        # Each process stores its calls once their answers are out.
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=20)
        while Call.objects.filter(session__owner=alice).count() < answered + refused:
            assert datetime.datetime.now() < deadline, "the calls were not all stored"
    print(f"two processes: {answered} answered, {refused} refused")
    assert refused > 0 and answered > 0
    _assert_bounded(alice)


# --- the dashboard and the admin ----------------------------------------------------------------


def test_it_sets_budgets_on_the_dashboard_for_staff_only(staff, alice, bob):
    admin = Client()
    admin.force_login(staff)
    page = admin.get("/budgets/").content.decode()
    assert 'id="budget-form"' in page
    added = admin.post(
        "/budgets/save/", {"user": "alice", "client_key": "", "period": "day", "limit": "2.5"}
    )
    assert added.status_code == 302
    budget = Budget.objects.get(user=alice)
    assert budget.limit_nano_usd == 2_500_000_000
    bad = admin.post("/budgets/save/", {"user": "alice", "period": "day", "limit": "2"})
    assert bad.status_code == 400 and "already has a budget" in bad.content.decode()
    admin.post("/budgets/save/", {"budget": str(budget.pk), "period": "week", "limit": "3"})
    budget.refresh_from_db()
    assert (budget.limit_nano_usd, budget.period) == (3 * 10**9, "week")
    # alice sees hers, read-only; bob sees none; neither may change them.
    mine = Client()
    mine.force_login(alice)
    html = mine.get("/budgets/").content.decode()
    assert "$3.00" in html and 'id="budget-form"' not in html
    assert (
        mine.post("/budgets/save/", {"user": "alice", "period": "day", "limit": "99"}).status_code
        == 403
    )
    other = Client()
    other.force_login(bob)
    assert "No budgets" in other.get("/budgets/").content.decode()
    assert other.post(f"/budgets/{budget.pk}/delete/").status_code == 403
    assert admin.post(f"/budgets/{budget.pk}/delete/").status_code == 302
    assert not Budget.objects.exists()


def test_it_sets_a_budget_in_the_admin(alice):
    from django.contrib.auth import get_user_model

    root = get_user_model().objects.create_superuser(username="root", password="pw-root")
    admin = Client()
    admin.force_login(root)
    answer = admin.post(
        "/admin/sessions_app/budget/add/",
        {"user": alice.pk, "client_key": "agent-a", "period": "month", "limit_usd": "12.5"},
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    budget = Budget.objects.get(user=alice, client_key="agent-a")
    assert budget.limit_nano_usd == 12_500_000_000 and budget.created_by == root
    listing = admin.get("/admin/sessions_app/budget/").content.decode()
    assert "agent-a" in listing and "$12.5" in listing
