"""The bill's arithmetic, without a database: cache reads and writes at their own rates,
savings at the uncached input rate, and no number at all for a model without a price."""

import pytest

from sessions_app.pricing import (
    NANO_PER_USD,
    CallUsage,
    hit_rate,
    price_call,
    price_input,
    saved_tokens,
    usd,
)

pytestmark = pytest.mark.profile_independent

MTOK = 1_000_000


def dollars(model, **usage):
    price = price_call(model, CallUsage(**usage))
    assert price.nano_usd is not None, price.reason
    return price.nano_usd / NANO_PER_USD


def test_it_prices_anthropic_cache_reads_at_a_tenth_and_writes_at_one_and_a_quarter():
    # claude-3.5-sonnet: $3 input, $0.30 cache read, $3.75 5-minute write, $6 1-hour write.
    assert dollars("claude-3.5-sonnet", input_tokens=MTOK) == 3.0
    assert dollars("claude-3.5-sonnet", input_tokens=MTOK, cached_input_tokens=MTOK) == 0.3
    assert dollars("claude-3.5-sonnet", input_tokens=MTOK, cache_write_tokens=MTOK) == 3.75
    one_hour = dollars(
        "claude-3.5-sonnet",
        input_tokens=MTOK,
        cache_write_tokens=MTOK,
        cache_write_1h_tokens=MTOK // 2,
    )
    assert one_hour == 0.5 * 3.75 + 0.5 * 6.0


def test_it_prices_a_mixed_call_as_the_sum_of_its_parts():
    mixed = dollars(
        "claude-3.5-sonnet",
        input_tokens=3 * MTOK,
        cached_input_tokens=MTOK,
        cache_write_tokens=MTOK,
        output_tokens=MTOK,
    )
    assert mixed == 3.0 + 0.3 + 3.75 + 15.0


def test_it_prices_openai_cached_input_at_the_models_cached_rate():
    # gpt-4o: $2.50 input, $1.25 cached input.
    assert dollars("gpt-4o", input_tokens=MTOK, cached_input_tokens=MTOK // 2) == 1.25 + 0.625


def test_it_gives_no_number_and_a_reason_for_a_model_without_a_price():
    price = price_call("my-own-finetune-xyz", CallUsage(input_tokens=1000, output_tokens=10))
    assert price.nano_usd is None
    assert "my-own-finetune-xyz" in price.reason
    empty = price_call("", CallUsage(input_tokens=1))
    assert empty.nano_usd is None and empty.reason


def test_it_clamps_inconsistent_cache_figures_to_the_input_they_are_part_of():
    # More cached tokens than input tokens is a client's error: never priced above the input.
    assert dollars("claude-3.5-sonnet", input_tokens=MTOK, cached_input_tokens=5 * MTOK) == 0.3


def test_it_prices_savings_at_the_uncached_input_rate():
    price = price_input("gpt-4o", 2 * MTOK)
    assert price.nano_usd == 5 * NANO_PER_USD
    assert usd(price.nano_usd) == 5.0


def test_it_computes_hit_rate_and_saved_tokens():
    assert hit_rate(cached=0, input_tokens=0) is None
    assert hit_rate(cached=900, input_tokens=1000) == 0.9
    assert saved_tokens(client_tokens=None, forwarded_tokens=10) == 0
    assert saved_tokens(client_tokens=1000, forwarded_tokens=400) == 600
    assert saved_tokens(client_tokens=100, forwarded_tokens=400) == 0


def test_it_stacks_each_calls_cached_input_under_its_uncached_input():
    from compaction_app.dashboard.chart import CallInput, input_bars

    bars = input_bars(
        [CallInput(1, 1000, 0), CallInput(2, 2000, 1500), CallInput(3, 500, 9999)],
        height=64,
        pad_top=4,
        pad_bottom=4,
    )
    assert [bar.call.seq for bar in bars] == [1, 2, 3]
    # The largest call fills the strip (56 px); its cached part is three quarters of it.
    assert bars[1].cached_height == 42.0 and bars[1].uncached_height == 14.0
    assert bars[1].cached_y == 60 - 42.0 and bars[1].uncached_y == 60 - 56.0
    assert bars[0].cached_height == 0.0 and bars[0].uncached_height == 28.0
    # More cached than input is clamped to the input.
    assert bars[2].uncached_height == 0.0 and bars[2].cached_height == 14.0
    assert input_bars([]) == ()
    assert len(input_bars([CallInput(i, 10) for i in range(1000)], max_bars=300)) == 300
