"""Budgets: a spend limit on a user's gateway calls (all of them, or one client key's) over a
calendar period (UTC day, week from Monday, month). Services (write) and selectors (read).

Counted in the database, so every server process shares one count without a race:
- before a call is forwarded, `budget_reserve` takes its estimated price from every budget
  that applies, each in one conditional UPDATE: admitted only while the period's settled
  spend plus what the calls in flight reserved plus this estimate stays within the limit —
  or, when no call is in flight, while anything is left at all (so one call may pass the
  limit, never more: the database serializes the UPDATEs of concurrent calls, in any
  process);
- once the answer is recorded, `budget_settle` swaps the estimate for the call's price;
- when the settled spend crosses 80 % and then 100 % of the limit, once per period each, a
  `budget_threshold` log line and (BUDGET_WEBHOOK_URL) a webhook go out.

The estimate (the gateway's, see compaction_app/gateway/budget.py) is an upper bound of the
call's price when the provider counts as we do: its input at the dearer of the input and
cache-write rates, and its output allowance (`max_tokens`, else LEDGER_BUDGET_OUTPUT_ALLOWANCE
tokens) at the output rate.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Greatest
from django.utils import timezone

from sessions_app import pricing
from sessions_app.errors import Conflict, InvalidInput, NotFound
from sessions_app.models import Budget, BudgetPeriod

logger = logging.getLogger("sessions_app.budgets")
audit = logging.getLogger("context")

# Reservations older than this were left by a process that died with calls in flight.
RESERVATION_LAPSE = datetime.timedelta(minutes=30)
# A budget's limit, at most (within a bigint of nanodollars).
MAX_LIMIT_USD = Decimal(1_000_000_000)
THRESHOLDS = (80, 100)


def period_start(period: str, now: datetime.datetime) -> datetime.datetime:
    """The start (UTC) of the period `now` falls in."""
    day = now.astimezone(datetime.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == BudgetPeriod.WEEK:
        return day - datetime.timedelta(days=day.weekday())
    if period == BudgetPeriod.MONTH:
        return day.replace(day=1)
    return day


def period_end(period: str, start: datetime.datetime) -> datetime.datetime:
    if period == BudgetPeriod.WEEK:
        return start + datetime.timedelta(days=7)
    if period == BudgetPeriod.MONTH:
        return (start + datetime.timedelta(days=32)).replace(day=1)
    return start + datetime.timedelta(days=1)


# --- reads ----------------------------------------------------------------------------------------


def budgets_visible_to(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Budget]:
    """Every budget for staff; a user's own otherwise."""
    queryset = Budget.objects.select_related("user")
    if getattr(user, "is_staff", False):
        return queryset.order_by("user__username", "client_key")
    return queryset.filter(user_id=user.pk or 0).order_by("client_key")


def budget_get(*, user: AbstractBaseUser | AnonymousUser, budget_id: Any) -> Budget:
    try:
        key = uuid.UUID(str(budget_id))
    except ValueError:
        raise NotFound("budget not found") from None
    found = budgets_visible_to(user=user).filter(pk=key).first()
    if found is None:
        raise NotFound("budget not found")
    return found


def applicable(*, user_id: Any, client_key: str | None) -> list[Budget]:
    """The budgets a call of `user_id` under `client_key` counts against (the user's own
    and the key's)."""
    keys = [""] + ([client_key] if client_key else [])
    return list(Budget.objects.filter(user_id=user_id, client_key__in=keys))


def budget_document(budget: Budget, *, now: datetime.datetime | None = None) -> dict[str, Any]:
    """A budget as the API shows it, its counters as of `now`'s period."""
    now = now or timezone.now()
    start = period_start(budget.period, now)
    current = budget.period_start >= start
    spent = budget.spent_nano_usd if current else 0
    reserved = max(budget.reserved_nano_usd, 0)
    limit = budget.limit_nano_usd
    return {
        "id": str(budget.pk),
        "user": budget.user.get_username(),
        "clientKey": budget.client_key or None,
        "period": budget.period,
        "limitUsd": pricing.usd(limit),
        "spentUsd": pricing.usd(max(spent, 0)),
        "reservedUsd": pricing.usd(reserved),
        "remainingUsd": pricing.usd(max(limit - spent, 0)),
        "percentUsed": round(100 * spent / limit, 1) if limit else None,
        "exceeded": spent >= limit,
        "periodStart": start.isoformat().replace("+00:00", "Z"),
        "periodEnd": period_end(budget.period, start).isoformat().replace("+00:00", "Z"),
        "createdAt": budget.created_at.isoformat().replace("+00:00", "Z"),
        "updatedAt": budget.updated_at.isoformat().replace("+00:00", "Z"),
    }


# --- writes ---------------------------------------------------------------------------------------


def _limit_nano(value: Any) -> int:
    try:
        amount = Decimal(str(value))
    except Exception:
        amount = Decimal(-1)
    if isinstance(value, bool) or not amount.is_finite() or not 0 < amount <= MAX_LIMIT_USD:
        raise InvalidInput(
            f"limitUsd must be a number of dollars above 0 and at most {MAX_LIMIT_USD}",
            fields={"limitUsd": "a positive number of dollars"},
        )
    return pricing.to_nano(amount)


def _period(value: Any) -> str:
    if value not in BudgetPeriod.values:
        raise InvalidInput(
            "period must be one of " + ", ".join(BudgetPeriod.values),
            fields={"period": "day, week or month"},
        )
    return str(value)


def _client_key(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 200 or "\x00" in value:
        raise InvalidInput(
            "clientKey must be a gateway client key (a string of at most 200 characters)",
            fields={"clientKey": "at most 200 characters"},
        )
    return value.strip()


def _user(value: Any) -> AbstractBaseUser:
    model = get_user_model()
    found = None
    if isinstance(value, int) and not isinstance(value, bool):
        found = model.objects.filter(pk=value).first()
    elif isinstance(value, str) and value:
        found = model.objects.filter(**{model.USERNAME_FIELD: value}).first()
    if found is None:
        raise InvalidInput("user: no such user", fields={"user": "a username or user id"})
    return found


def budget_create(
    *, user: Any, period: Any, limit_usd: Any, client_key: Any = None, created_by: Any = None
) -> Budget:
    owner: Any = user if isinstance(user, get_user_model()) else _user(user)
    chosen = _period(period)
    try:
        with transaction.atomic():
            return Budget.objects.create(
                user=owner,
                client_key=_client_key(client_key),
                period=chosen,
                limit_nano_usd=_limit_nano(limit_usd),
                period_start=period_start(chosen, timezone.now()),
                created_by=created_by if getattr(created_by, "pk", None) else None,
            )
    except IntegrityError:
        raise Conflict(
            "this user already has a budget for this client key", code="budget_exists"
        ) from None


def budget_update(*, budget: Budget, period: Any = None, limit_usd: Any = None) -> Budget:
    """Change the limit or the period (a new period starts counting afresh)."""
    changes: dict[str, Any] = {}
    if limit_usd is not None:
        changes["limit_nano_usd"] = _limit_nano(limit_usd)
    if period is not None and _period(period) != budget.period:
        changes.update(
            period=period,
            period_start=period_start(period, timezone.now()),
            spent_nano_usd=0,
            alerted_80=False,
            alerted_100=False,
        )
    if changes:
        Budget.objects.filter(pk=budget.pk).update(**changes, updated_at=timezone.now())
        budget.refresh_from_db()
        # A raised limit may leave a threshold not reached any more: it alerts again later.
        rearm = {
            f"alerted_{percent}": False
            for percent in THRESHOLDS
            if budget.spent_nano_usd * 100 < budget.limit_nano_usd * percent
        }
        if rearm:
            Budget.objects.filter(pk=budget.pk).update(**rearm)
            budget.refresh_from_db()
    return budget


def budget_delete(*, budget: Budget) -> None:
    budget.delete()


# --- the gateway's calls ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    budget: Budget
    message: str
    retry_after: int


@dataclass
class Reservation:
    """What a call reserved, budget by budget, in each one's period."""

    estimate: int
    held: list[tuple[uuid.UUID, datetime.datetime]] = field(default_factory=list)
    settled: bool = False


def _roll(budget: Budget, now: datetime.datetime) -> None:
    """Start the budget's current period if a new one began (once, whatever the process)."""
    start = period_start(budget.period, now)
    if budget.period_start < start:
        Budget.objects.filter(pk=budget.pk, period_start__lt=start).update(
            period_start=start, spent_nano_usd=0, alerted_80=False, alerted_100=False
        )
    # Reservations no call will settle (their process died) lapse.
    Budget.objects.filter(pk=budget.pk, reserved_at__lt=now - RESERVATION_LAPSE).update(
        reserved_nano_usd=0, in_flight=0, reserved_at=None
    )


def _refusal(budget: Budget, now: datetime.datetime) -> Refusal:
    budget.refresh_from_db()
    start = period_start(budget.period, now)
    end = period_end(budget.period, start)
    scope = f"client key {budget.client_key!r}" if budget.client_key else "this user's calls"
    message = (
        f"Budget exceeded: the {budget.period}ly limit of ${pricing.usd(budget.limit_nano_usd):g} "
        f"for {scope} is spent (${pricing.usd(max(budget.spent_nano_usd, 0)):g} this "
        f"{budget.period}, ${pricing.usd(max(budget.reserved_nano_usd, 0)):g} in flight). "
        f"It resets at {end.isoformat().replace('+00:00', 'Z')}; the call was not forwarded."
    )
    return Refusal(
        budget=budget, message=message, retry_after=max(int((end - now).total_seconds()), 1)
    )


def budget_exhausted(
    *, budgets: Sequence[Budget], now: datetime.datetime | None = None
) -> Refusal | None:
    """The first budget already spent (checked before anything of the call is recorded)."""
    now = now or timezone.now()
    for budget in budgets:
        start = period_start(budget.period, now)
        if budget.period_start >= start and budget.spent_nano_usd >= budget.limit_nano_usd:
            return _refusal(budget, now)
    return None


def budget_reserve(
    *, budgets: Sequence[Budget], estimate: int, now: datetime.datetime | None = None
) -> Reservation | Refusal:
    """Reserve `estimate` nanodollars on every budget of the call, or refuse it (releasing
    what was taken). One conditional UPDATE per budget: the database decides, so two
    processes cannot both take the last of a budget."""
    now = now or timezone.now()
    estimate = max(int(estimate), 0)
    reservation = Reservation(estimate=estimate)
    for budget in budgets:
        _roll(budget, now)
        start = period_start(budget.period, now)
        fits = Q(spent_nano_usd__lte=F("limit_nano_usd") - F("reserved_nano_usd") - estimate)
        alone = Q(in_flight__lte=0, spent_nano_usd__lt=F("limit_nano_usd"))
        taken = (
            Budget.objects.filter(pk=budget.pk, period_start=start)
            .filter(fits | alone)
            .update(
                reserved_nano_usd=F("reserved_nano_usd") + estimate,
                in_flight=F("in_flight") + 1,
                reserved_at=now,
            )
        )
        if not taken:
            budget_release(reservation=reservation)
            return _refusal(budget, now)
        reservation.held.append((budget.pk, start))
    return reservation


def budget_release(*, reservation: Reservation) -> None:
    """Give back what a call reserved without spending anything (it was never forwarded)."""
    budget_settle(reservation=reservation, actual=0, alert=False)


def budget_settle(
    *,
    reservation: Reservation,
    actual: int,
    alert: bool = True,
    now: datetime.datetime | None = None,
) -> None:
    """Swap a call's reservation for its price (`actual` nanodollars), then send the
    period's threshold alerts the spend now crosses. Once per reservation."""
    if reservation.settled:
        return
    reservation.settled = True
    now = now or timezone.now()
    actual = max(int(actual), 0)
    for budget_id, start in reservation.held:
        released = {
            "reserved_nano_usd": Greatest(F("reserved_nano_usd") - reservation.estimate, 0),
            "in_flight": Greatest(F("in_flight") - 1, 0),
        }
        # Spend counts in the period the call was admitted in, if that is still the budget's.
        Budget.objects.filter(pk=budget_id, period_start=start).update(
            spent_nano_usd=F("spent_nano_usd") + actual, **released
        )
        Budget.objects.filter(pk=budget_id, period_start__gt=start).update(**released)
        if alert and actual:
            _alert(budget_id, start, now)


def _alert(budget_id: uuid.UUID, start: datetime.datetime, now: datetime.datetime) -> None:
    for percent in THRESHOLDS:
        flag = f"alerted_{percent}"
        crossed = Budget.objects.filter(
            pk=budget_id,
            period_start=start,
            **{flag: False, "spent_nano_usd__gte": F("limit_nano_usd") * percent / 100},
        ).update(**{flag: True})
        if crossed:
            budget = Budget.objects.select_related("user").get(pk=budget_id)
            _announce(budget, percent, now)


def _announce(budget: Budget, percent: int, now: datetime.datetime) -> None:
    payload = {
        "type": "budget_threshold",
        "percent": percent,
        **budget_document(budget, now=now),
    }
    audit.warning(
        "budget_threshold %s",
        {k: payload[k] for k in ("percent", "user", "clientKey", "spentUsd", "limitUsd")},
        extra={"budget_id": str(budget.pk), "percent": percent},
    )
    from django.conf import settings

    if getattr(settings, "BUDGET_WEBHOOK_URL", ""):
        try:
            from sessions_app.tasks import budget_webhook

            budget_webhook.delay(payload)
        except Exception:
            logger.exception("could not queue the budget webhook for budget %s", budget.pk)
