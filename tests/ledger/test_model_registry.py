import threading
from decimal import Decimal

import pytest

from sessions_app.model_registry import (
    DEFAULT_OVERRIDES,
    ModelInfo,
    ModelRegistry,
    default_registry,
)
from sessions_app.pricing import estimate_cost_usd

pytestmark = pytest.mark.profile_independent


@pytest.fixture(scope="module")
def registry():
    return ModelRegistry()


def test_it_resolves_gemini_3_pro_through_the_default_override(registry):
    info = registry.lookup("gemini-3-pro")
    assert info is not None
    assert info.context_limit == 1_000_000
    assert info.encoding == "cl100k_base"
    assert info.native_encoding is False
    assert DEFAULT_OVERRIDES["gemini-3-pro"] == 1_000_000


def test_it_resolves_claude_3_5_sonnet_through_anthropic_match_clause(registry):
    info = registry.lookup("claude-3.5-sonnet")
    assert info == ModelInfo(
        model="claude-3.5-sonnet",
        context_limit=200_000,
        encoding="cl100k_base",
        native_encoding=False,
        provider="anthropic",
        canonical_id="claude-3-5-sonnet",
    )


def test_it_resolves_gpt_4o(registry):
    info = registry.lookup("gpt-4o")
    assert info is not None
    assert info.context_limit == 128_000
    assert info.encoding == "o200k_base"
    assert info.native_encoding is True


@pytest.mark.parametrize(
    ("name", "limit"),
    [
        ("openai/gpt-4o", 128_000),
        ("anthropic/claude-3.5-sonnet", 200_000),
        ("openrouter/anthropic/claude-3.5-sonnet", 200_000),
        ("Claude-3-5-Sonnet-20241022", 200_000),
        ("  gpt-4o  ", 128_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("gpt-4.1", 1_000_000),
        ("gpt-5", 400_000),
        ("o3", 200_000),
        ("gpt-4", 8_192),
    ],
)
def test_it_accepts_prefixed_and_variant_names(registry, name, limit):
    info = registry.lookup(name)
    assert info is not None, name
    assert info.context_limit == limit
    assert info.model == name.strip()


def test_it_returns_none_for_unknown_models(registry):
    assert registry.lookup("definitely-not-a-model-xyz") is None
    assert registry.lookup("") is None
    assert registry.lookup("nosuchprovider/nosuchmodel") is None


def test_it_lets_overrides_win_over_genai_prices():
    custom = ModelRegistry(overrides={"GPT-4o": 64_000, "my-local-llm": 32_768})
    assert custom.lookup("gpt-4o").context_limit == 64_000
    assert custom.lookup("openai/gpt-4o").context_limit == 64_000
    assert custom.lookup("my-local-llm").context_limit == 32_768
    # Settings overrides merge over the defaults rather than replacing them.
    assert custom.lookup("gemini-3-pro").context_limit == 1_000_000
    bigger = ModelRegistry(overrides={"gemini-3-pro": 2_000_000})
    assert bigger.lookup("gemini-3-pro").context_limit == 2_000_000


def test_it_rejects_non_positive_overrides():
    with pytest.raises(ValueError):
        ModelRegistry(overrides={"x": 0})
    with pytest.raises(ValueError):
        ModelRegistry(overrides={"x": True})


def test_it_lists_the_documented_models(registry):
    by_name = {m.model: m for m in registry.all_models()}
    assert by_name["gemini-3-pro"].context_limit == 1_000_000
    assert by_name["claude-3.5-sonnet"].context_limit == 200_000
    assert by_name["claude-3-5-sonnet"].context_limit == 200_000
    assert by_name["gpt-4o"].context_limit == 128_000
    assert by_name["gpt-4o"].provider == "openai"


def test_it_lists_sorted_unique_models_with_known_windows(registry):
    models = registry.all_models()
    names = [m.model for m in models]
    assert names == sorted(names)
    assert len(names) == len(set(names))
    assert all(isinstance(m.context_limit, int) and m.context_limit > 0 for m in models)
    assert registry.all_models() == models


def test_it_prefers_first_party_providers_in_the_listing(registry):
    by_name = {m.model: m for m in registry.all_models()}
    # Google and Azure resell these too; the listing names the first party.
    assert by_name["claude-3-5-sonnet"].provider == "anthropic"
    assert by_name["o1"].provider == "openai"


def test_it_includes_overrides_in_the_listing():
    models = ModelRegistry(overrides={"my-local-llm": 32_768, "gpt-4o": 64_000}).all_models()
    by_name = {m.model: m for m in models}
    assert by_name["my-local-llm"].context_limit == 32_768
    assert by_name["gpt-4o"].context_limit == 64_000


def test_it_answers_repeated_lookups_from_cache(registry):
    first = registry.lookup("claude-3.5-sonnet")
    assert registry.lookup("claude-3.5-sonnet") is first
    assert registry.lookup("unknown-model-abc") is None


def test_it_is_safe_to_use_from_several_threads():
    fresh = ModelRegistry()
    results = []

    def work():
        results.append((fresh.lookup("gpt-4o").context_limit, len(fresh.all_models())))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1


def test_it_shares_one_default_registry():
    assert default_registry() is default_registry()
    assert default_registry().lookup("gpt-4o").context_limit == 128_000


def test_it_estimates_a_positive_cost_for_gpt_4o():
    cost = estimate_cost_usd("gpt-4o", input_tokens=1_000, output_tokens=500)
    assert isinstance(cost, Decimal)
    assert cost > 0
    assert estimate_cost_usd("openai/gpt-4o", input_tokens=1_000, output_tokens=500) == cost
    more = estimate_cost_usd("gpt-4o", input_tokens=2_000, output_tokens=1_000)
    assert more == cost * 2


def test_it_returns_no_cost_for_unknown_models_or_bad_input():
    assert (
        estimate_cost_usd("definitely-not-a-model-xyz", input_tokens=10, output_tokens=10) is None
    )
    assert estimate_cost_usd("", input_tokens=10, output_tokens=10) is None
    assert estimate_cost_usd("gpt-4o", input_tokens=-1, output_tokens=10) is None


def test_it_resolves_every_listed_model_to_the_window_it_is_listed_with(registry):
    # GET /models offered reseller ids (glm-4p7, codestral) that session create refused, and
    # listed others with a reseller's window while a session of that name got another one.
    listed = registry.all_models()
    assert {"glm-4p7", "codestral"} <= {info.model for info in listed}
    for info in listed:
        found = registry.lookup(info.model)
        assert found is not None, info.model
        assert (found.context_limit, found.encoding) == (info.context_limit, info.encoding)


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gemini-3-pro", 1_000_000),
        ("gemini-3-pro-preview", 1_048_576),
        ("gemini-3.1-pro-preview", 1_048_576),
        ("gemini-2.5-pro", 1_048_576),
        ("gemini-2.5-flash", 1_048_576),
        ("gemini-2.5-flash-lite", 1_000_000),
    ],
)
def test_it_knows_the_gemini_models_gemini_cli_and_the_sdk_name(registry, model, window):
    info = registry.lookup(model)
    assert info is not None and info.context_limit == window
