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
from collections.abc import Sequence
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
    # Part of output_tokens the model spent reasoning (OpenAI's reasoning_tokens, Gemini's
    # thoughtsTokenCount, Anthropic's thinking): priced at the output rate unless the model
    # has a reasoning rate of its own.
    reasoning_tokens: int = 0


# The kinds a call's price is split into (costByKind), in the order they are shown.
KINDS = ("input", "cacheRead", "cacheWrite5m", "cacheWrite1h", "output", "reasoning")


@dataclass(frozen=True)
class Breakdown:
    """A call's price by token kind: `kinds[kind] = (tokens, nanodollars)`. `input` is the
    uncached input; `cacheWrite5m` every write not at the one-hour rate; `reasoning` is a part
    of `output` (its tokens are counted there too) and is priced apart only when the model
    has a reasoning rate, else its share of the output price is shown. `nano_usd` is the
    call's price, as price_call gives it (None: no price, with `reason`)."""

    nano_usd: int | None
    kinds: dict[str, tuple[int, int]]
    reason: str = ""

    def document(self) -> dict[str, dict[str, Any]]:
        """As the API shows it: {kind: {tokens, usd}} for each kind with tokens."""
        return {
            kind: {"tokens": tokens, "usd": usd(nano)}
            for kind in KINDS
            if kind in self.kinds
            for tokens, nano in (self.kinds[kind],)
            if tokens
        }


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


def price_call(model: str, usage: CallUsage, apart: Sequence[CallUsage] = ()) -> Price:
    """The price of one call to `model`: uncached input, cache reads, cache writes (5-minute
    and one-hour) and output each at the model's own rate. A model genai-prices has no price
    for gives `Price(None, reason)`: a guess would be a wrong number on someone's bill."""
    found = price_breakdown(model, usage, apart)
    return Price(found.nano_usd, found.reason)


def _figures(usage: CallUsage) -> dict[str, int]:
    """genai-prices' usage fields, the cache parts clamped to the input they are parts of."""
    total = _clean(usage.input_tokens)
    read = min(_clean(usage.cached_input_tokens), total)
    write = min(_clean(usage.cache_write_tokens), total - read)
    write_1h = min(_clean(usage.cache_write_1h_tokens), write)
    output = _clean(usage.output_tokens)
    fields: dict[str, int] = {"input_tokens": total, "output_tokens": output}
    if read:
        fields["cache_read_tokens"] = read
    if write:
        fields["cache_write_tokens"] = write
    if write_1h:
        fields["cache_write_1h_tokens"] = write_1h
    reasoning = min(_clean(usage.reasoning_tokens), output)
    if reasoning:
        fields["output_reasoning_tokens"] = reasoning
    return fields


def price_breakdown(model: str, usage: CallUsage, apart: Sequence[CallUsage] = ()) -> Breakdown:
    """The price of one call to `model`, by token kind (Breakdown). The total is genai-prices'
    own; each kind is that kind's share as genai-prices computes it (its unit price applied to
    the kind's tokens, tiers chosen on the call's whole input, as the provider bills).

    `apart`: parts of `usage` the provider sampled as requests of their own (Anthropic's
    server-side compaction iterations): each is priced alone (a long-context tier applies per
    request, not to their sum), the rest of `usage` as one request."""
    if apart:
        return _price_apart(model, usage, apart)
    key = (model or "").strip().lower()
    if not key:
        return Breakdown(None, {}, "the call's model is unknown")
    fields = _figures(usage)
    try:
        found = _resolve(key)
        if found is None:
            return Breakdown(None, {}, f"no price is known for model {model!r}")
        ref, provider_id = found
        total, kinds = _calc_kinds(fields, ref, provider_id)
    except Exception:  # a data quirk must never fail a request; unknown is not wrong
        return Breakdown(None, {}, f"no price could be computed for model {model!r}")
    return Breakdown(to_nano(total), kinds)


def _minus(usage: CallUsage, parts: Sequence[CallUsage]) -> CallUsage:
    def rest(name: str) -> int:
        return max(_clean(getattr(usage, name)) - sum(_clean(getattr(p, name)) for p in parts), 0)

    return CallUsage(
        input_tokens=rest("input_tokens"),
        output_tokens=rest("output_tokens"),
        cached_input_tokens=rest("cached_input_tokens"),
        cache_write_tokens=rest("cache_write_tokens"),
        cache_write_1h_tokens=rest("cache_write_1h_tokens"),
        reasoning_tokens=rest("reasoning_tokens"),
    )


def _price_apart(model: str, usage: CallUsage, apart: Sequence[CallUsage]) -> Breakdown:
    pieces = [
        price_breakdown(model, _minus(usage, apart)),
        *(price_breakdown(model, p) for p in apart),
    ]
    for piece in pieces:
        if piece.nano_usd is None:
            return piece
    kinds: dict[str, tuple[int, int]] = {}
    for piece in pieces:
        for kind, (tokens, nano) in piece.kinds.items():
            had = kinds.get(kind, (0, 0))
            kinds[kind] = (had[0] + tokens, had[1] + nano)
    return Breakdown(sum(piece.nano_usd or 0 for piece in pieces), kinds)


# genai-prices' units (their dimensions) → the kinds a price is shown in.
def _kind_of(dimensions: dict[str, str]) -> str | None:
    if dimensions.get("family") != "tokens":
        return None
    kind = dimensions.get("token_type")
    if dimensions.get("direction") == "output":
        return "reasoning" if kind == "reasoning" else "output"
    if kind == "cache_read":
        return "cacheRead"
    if kind == "cache_write":
        return "cacheWrite1h" if dimensions.get("cache_ttl") == "1h" else "cacheWrite5m"
    return "input"


def _calc_kinds(
    fields: dict[str, int], ref: str, provider_id: str | None
) -> tuple[Decimal, dict[str, tuple[int, int]]]:
    """(total in USD, {kind: (tokens, nanodollars)}) as genai-prices prices `fields`."""
    from genai_prices.types import Usage

    reasoning = fields.get("output_reasoning_tokens", 0)
    usage = Usage(**fields)
    provider, model = _find(ref, provider_id)
    result = model.calc_price(usage, provider)  # type: ignore[arg-type]
    total = result.total_price
    total = total if isinstance(total, Decimal) else Decimal(str(total))
    kinds: dict[str, tuple[int, int]] = {}
    try:
        kinds = _split(result.model_price, usage)
    except Exception:  # genai-prices' internals moved: the total stands, shown as one kind
        kinds = {}
    if not kinds:
        kinds = {"input": (fields["input_tokens"], to_nano(Decimal(str(result.input_price))))}
        kinds["output"] = (fields["output_tokens"], to_nano(Decimal(str(result.output_price))))
    if reasoning and "reasoning" not in kinds:
        # A part of the output, at the output's own rate: shown, not added.
        tokens, nano = kinds.get("output", (0, 0))
        share = (nano * reasoning // tokens) if tokens else 0
        kinds["reasoning"] = (reasoning, share)
    return total, kinds


def _split(model_price: Any, usage: Any) -> dict[str, tuple[int, int]]:
    """genai-prices' calc_price, unit by unit (its own helpers: the same leaf counts and
    tier rule), so each kind's share is exactly what the total is made of."""
    from genai_prices import types as gp
    from genai_prices.units import _get_registry

    registry = _get_registry()
    resolved = gp._collect_resolved_model_prices(model_price, registry)
    counts = gp._compute_registry_priced_counts(resolved, usage)
    tiered = any(isinstance(price, gp.TieredPrices) for _, price in resolved)
    total_input = usage.input_tokens if tiered else 0
    kinds: dict[str, tuple[int, int]] = {}
    for unit, price in resolved:
        kind = _kind_of(dict(unit.dimensions))
        if kind is None:
            continue
        count = counts.get(unit.usage_key, 0)
        amount = gp.calc_unit_price(price, count, total_input, unit.per)
        tokens, nano = kinds.get(kind, (0, 0))
        kinds[kind] = (tokens + int(count), nano + to_nano(Decimal(str(amount))))
    return kinds


@dataclass(frozen=True)
class Rates:
    """A model's per-token prices in USD (its base tier): uncached input, cache read, cache
    write (the 5-minute rate; the input rate where the provider bills no writes) and output."""

    input: Decimal
    cache_read: Decimal
    cache_write: Decimal
    output: Decimal


_RATE_TOKENS = 1000  # within every model's base tier


@functools.lru_cache(maxsize=256)
def rates(model: str) -> Rates | None:
    """`model`'s per-token prices, from genai-prices (None: no price)."""

    def rate(**usage: int) -> Decimal | None:
        found = price_breakdown(model, CallUsage(**usage)).nano_usd
        return None if found is None else Decimal(found) / NANO_PER_USD / _RATE_TOKENS

    n = _RATE_TOKENS
    found = (
        rate(input_tokens=n),
        rate(input_tokens=n, cached_input_tokens=n),
        rate(input_tokens=n, cache_write_tokens=n),
        rate(output_tokens=n),
    )
    if any(value is None for value in found):
        return None
    fresh, read, write, output = (value or Decimal(0) for value in found)
    return Rates(input=fresh, cache_read=read, cache_write=write, output=output)


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
