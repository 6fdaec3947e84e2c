"""The provider bill, priced: what one provider call cost, what fitting saved, the cache hit
rate. Pure module: no Django, no ORM, no settings. Prices come from genai-prices' bundled
data (the same snapshot the model registry reads windows from).

Money is kept as integer nanodollars (10⁻⁹ USD) wherever it is summed: a call's price is
rounded to the nanodollar once (half a nanodollar at most, where a per-token price has more
decimals than that), and from then on a session's running total stays exact in an integer
column on every database, where a float or SQLite's decimal would drift. The largest call
the API accepts (10¹² tokens of each kind) at the dearest published rates stays below a
bigint's range; a session's total is bounded by MAX_TOTAL_NANO_USD.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from sessions_app.model_registry import _provider_by_id, _snapshot

NANO_PER_USD = 10**9
# A session's cost and savings stay below this (9 × 10⁹ USD): within a bigint on every database.
MAX_TOTAL_NANO_USD = 9 * 10**18


@dataclass(frozen=True)
class CallUsage:
    """One provider call's usage, in the provider-neutral shape the ledger stores.

    `input_tokens` is everything the model read, cached or not (OpenAI's `prompt_tokens`;
    Anthropic's `input_tokens + cache_creation_input_tokens + cache_read_input_tokens`).
    `cached_input_tokens` (cache reads) and `cache_write_tokens` (cache writes, of which
    `cache_write_1h_tokens` at the one-hour rate) are parts of it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0


@dataclass(frozen=True)
class Price:
    """A call's price in nanodollars, or why there is none."""

    nano_usd: int | None
    reason: str = ""

    @property
    def known(self) -> bool:
        return self.nano_usd is not None


def to_nano(amount: Decimal) -> int:
    return int((amount * NANO_PER_USD).to_integral_value(rounding=ROUND_HALF_EVEN))


def usd(nano: int) -> float:
    """Nanodollars as US dollars (a JSON number; nine decimals, the unit kept)."""
    return round(nano / NANO_PER_USD, 9)


def usd_text(amount: float | Decimal | None) -> str:
    """A dollar amount as every page shows it: thousands separators, cents from a dollar up,
    four decimals below it, and two significant digits below a cent, so a small cost is never
    "$0.0000" ("$0.000042"); None is "—"."""
    if amount is None:
        return "—"
    value = Decimal(str(amount))
    if value == 0:
        return "$0.00"
    sign, value = ("−", -value) if value < 0 else ("", value)
    if value >= 1:
        return f"{sign}${value:,.2f}"
    if value >= Decimal("0.01"):
        return f"{sign}${value:.4f}"
    if value < Decimal("0.000000001"):
        return f"{sign}<$0.000000001"
    digits = max(2 - value.adjusted() - 1, 2)  # two significant digits
    return f"{sign}${value:.{digits}f}"


def _clean(value: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def price_call(model: str, usage: CallUsage) -> Price:
    """The price of one call to `model`: uncached input, cache reads, cache writes (5-minute
    and one-hour) and output each at the model's own rate. A model genai-prices has no price
    for gives `Price(None, reason)`: a guess would be a wrong number on someone's bill."""
    key = (model or "").strip().lower()
    if not key:
        return Price(None, "the call's model is unknown")
    total = _clean(usage.input_tokens)
    read = min(_clean(usage.cached_input_tokens), total)
    write = min(_clean(usage.cache_write_tokens), total - read)
    write_1h = min(_clean(usage.cache_write_1h_tokens), write)
    try:
        from genai_prices.types import Usage

        fields: dict[str, int] = {
            "input_tokens": total,
            "output_tokens": _clean(usage.output_tokens),
        }
        if read:
            fields["cache_read_tokens"] = read
        if write:
            fields["cache_write_tokens"] = write
        if write_1h:
            fields["cache_write_1h_tokens"] = write_1h
        found = _resolve(key)
        if found is None:
            return Price(None, f"no price is known for model {model!r}")
        ref, provider_id = found
        result = _calc(Usage(**fields), ref, provider_id)
    except Exception:  # a data quirk must never fail a request; unknown is not wrong
        return Price(None, f"no price could be computed for model {model!r}")
    amount = result if isinstance(result, Decimal) else Decimal(str(result))
    return Price(to_nano(amount))


def price_input(model: str, tokens: int) -> Price:
    """What `tokens` uncached input tokens cost on `model` (the rate savings are priced at)."""
    return price_call(model, CallUsage(input_tokens=tokens))


def hit_rate(*, cached: int, input_tokens: int) -> float | None:
    """Cached ÷ all input tokens of the provider calls, four decimals; None before any."""
    if input_tokens <= 0:
        return None
    return round(min(cached, input_tokens) / input_tokens, 4)


def saved_tokens(*, client_tokens: int | None, forwarded_tokens: int) -> int:
    """What fitting kept from being sent on one call: the client's whole request minus what
    was forwarded (never negative: a summary may cost more than what it replaced)."""
    if client_tokens is None:
        return 0
    return max(client_tokens - forwarded_tokens, 0)


def _calc(usage: object, ref: str, provider_id: str | None) -> Decimal:
    provider, model = _find(ref, provider_id)
    result = model.calc_price(usage, provider)  # type: ignore[arg-type]
    price = result.total_price
    return price if isinstance(price, Decimal) else Decimal(str(price))


@functools.lru_cache(maxsize=1024)
def _find(ref: str, provider_id: str | None) -> tuple[Any, Any]:
    """genai-prices' (provider, model) for a ref, looked up once: the look-up is most of a
    call's pricing time, and every reply the gateway records is priced."""
    return _snapshot().find_provider_model(ref, None, provider_id, None)


@functools.lru_cache(maxsize=1024)
def _resolve(key: str) -> tuple[str, str | None] | None:
    """The (model ref, provider id) genai-prices prices `key` under, tried as the model
    registry tries names: "provider/model", the whole name, then the name without prefix."""
    from genai_prices.types import Usage

    attempts: list[tuple[str, str | None]] = []
    if "/" in key:
        prefix, rest = key.split("/", 1)
        if _provider_by_id(prefix) is not None:
            attempts.append((rest, prefix))
    attempts.append((key, None))
    bare = key.rsplit("/", 1)[-1]
    if bare != key:
        attempts.append((bare, None))
    for ref, provider_id in attempts:
        try:
            _calc(Usage(input_tokens=1), ref, provider_id)
        except LookupError:
            continue
        return ref, provider_id
    return None


def estimate_cost_usd(model: str, *, input_tokens: int, output_tokens: int) -> Decimal | None:
    """Price in USD of one call from genai-prices' bundled prices; None when unknown."""
    if input_tokens < 0 or output_tokens < 0:
        return None
    price = price_call(model, CallUsage(input_tokens=input_tokens, output_tokens=output_tokens))
    if price.nano_usd is None:
        return None
    return Decimal(price.nano_usd) / NANO_PER_USD
