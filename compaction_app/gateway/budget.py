"""Budgets in the call path (sessions_app.budgets counts them): a call whose user or client
key has spent its budget is refused before anything of it is recorded; otherwise, once it is
fitted, its estimated price is reserved on each of its budgets before it is forwarded (or it
is refused then), and settled with its real price when the call is stored (calls.py).

The refusal is the provider's own 429 (OpenAI `insufficient_quota`, Anthropic
`rate_limit_error`, Gemini `RESOURCE_EXHAUSTED`) with the code `budget_exceeded`, a
`Retry-After` to the period's end, and `x-should-retry: false`, which the official SDKs
obey instead of retrying a call that cannot pass before then.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings

from compaction_app.gateway.messages import GatewayError
from sessions_app import budgets, pricing
from sessions_app.models import Budget

# Where each wire's request names its output bound.
_OUTPUT_BOUNDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def refused(refusal: budgets.Refusal) -> GatewayError:
    return GatewayError(
        refusal.message,
        status=429,
        code="budget_exceeded",
        headers={"Retry-After": str(refusal.retry_after), "x-should-retry": "false"},
    )


def check(*, user_id: Any, client_key: str | None) -> list[Budget]:
    """The call's budgets; GatewayError (429) when one of them is already spent."""
    found = budgets.applicable(user_id=user_id, client_key=client_key)
    if found:
        refusal = budgets.budget_exhausted(budgets=found)
        if refusal is not None:
            raise refused(refusal)
    return found


def _output_allowance(body: dict[str, Any]) -> int:
    for name in _OUTPUT_BOUNDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    config = body.get("generationConfig") or body.get("generation_config")
    if isinstance(config, dict):
        value = config.get("maxOutputTokens") or config.get("max_output_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return int(settings.LEDGER_BUDGET_OUTPUT_ALLOWANCE)


def estimate(*, model: str, tokens: int, body: dict[str, Any]) -> int:
    """An upper bound of the call's price in nanodollars (0 for a model with no price): its
    input at the dearer of the input and cache-write rates, its output allowance at the
    output rate."""
    rates = pricing.rates(model)
    if rates is None:
        return 0
    dearest = max(rates.input, rates.cache_write)
    amount = Decimal(max(tokens, 0)) * dearest + _output_allowance(body) * rates.output
    return pricing.to_nano(amount)


def reserve(
    *, found: list[Budget], model: str, tokens: int, body: dict[str, Any]
) -> budgets.Reservation:
    """Reserve the call's estimate on its budgets; GatewayError (429) when one cannot take it."""
    result = budgets.budget_reserve(
        budgets=found, estimate=estimate(model=model, tokens=tokens, body=body)
    )
    if isinstance(result, budgets.Refusal):
        raise refused(result)
    return result
