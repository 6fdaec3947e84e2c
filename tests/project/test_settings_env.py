"""Keeps the table of environment variables in docs/operations.md equal to what settings read."""

import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config import env

pytestmark = pytest.mark.profile_independent

ROOT = Path(__file__).resolve().parents[2]


def _settings_variables() -> set[str]:
    source = (ROOT / "config" / "settings.py").read_text()
    return set(re.findall(r"env_(?:str|bool|int|float|list|json)\(\s*\"([A-Z0-9_]+)\"", source))


def _documented_variables() -> set[str]:
    manual = (ROOT / "docs" / "operations.md").read_text()
    section = manual.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Z0-9_]+)` \|", section, flags=re.MULTILINE))


def test_it_documents_every_environment_variable_in_the_operations_manual():
    assert _settings_variables(), "no variables found: the pattern is stale"
    assert _settings_variables() == _documented_variables()


def test_it_refuses_a_malformed_boolean(monkeypatch):
    monkeypatch.setenv("SOME_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="SOME_FLAG"):
        env.env_bool("SOME_FLAG", False)


def test_it_refuses_a_non_integer_and_an_integer_below_its_minimum(monkeypatch):
    monkeypatch.setenv("SOME_INT", "12x")
    with pytest.raises(ImproperlyConfigured):
        env.env_int("SOME_INT", 1)
    monkeypatch.setenv("SOME_INT", "0")
    with pytest.raises(ImproperlyConfigured):
        env.env_int("SOME_INT", 1, minimum=1)


def test_it_refuses_malformed_json(monkeypatch):
    monkeypatch.setenv("SOME_JSON", "{not json")
    with pytest.raises(ImproperlyConfigured):
        env.env_json("SOME_JSON", {})


def test_it_uses_the_default_for_an_empty_value(monkeypatch):
    monkeypatch.setenv("SOME_INT", "  ")
    assert env.env_int("SOME_INT", 7) == 7


# --- issue 42, row 12: values checked at start-up -----------------------------------------------


@pytest.mark.parametrize("value", ["１２８", "1_000", "12.0", "0x10", "٣"])
def test_it_refuses_an_integer_not_written_in_ascii_digits(monkeypatch, value):
    monkeypatch.setenv("SOME_INT", value)
    with pytest.raises(ImproperlyConfigured, match="ASCII digits"):
        env.env_int("SOME_INT", 1)


@pytest.mark.parametrize("value", ["inf", "nan", "-Infinity", "１.５", "1_0.5"])
def test_it_refuses_a_float_that_is_not_a_finite_ascii_number(monkeypatch, value):
    monkeypatch.setenv("SOME_FLOAT", value)
    with pytest.raises(ImproperlyConfigured, match="SOME_FLOAT"):
        env.env_float("SOME_FLOAT", 1.0)


def test_the_context_limit_bound_is_the_apis():
    from sessions_app.services import MAX_CONTEXT_LIMIT

    source = (ROOT / "config" / "settings.py").read_text()
    assert source.count(f"{MAX_CONTEXT_LIMIT:_}") >= 2, "settings' bound differs from the API's"


def _start(**variables: str):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings", **variables},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT", str(10**20)),
        ("LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT", "3e9"),
        ("LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT", "100000001"),
        ("LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT", "１２８"),
        ("MODEL_CONTEXT_OVERRIDES", '{"local-llm": 100000001}'),
        ("MODEL_CONTEXT_OVERRIDES", '{"local-llm": "128000"}'),
    ],
)
def test_it_refuses_a_window_the_api_would_refuse_at_start_up(variable, value):
    """Issue 42, row 12: the server started with LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT 10**20
    (or 3e9, 100000001), then failed every unknown model's call with `400 contextLimit must be
    a positive integer`. It now refuses to start, naming the variable."""
    started = _start(**{variable: value})
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr and variable in started.stderr
    assert (
        _start(**{variable: "128000" if "LIMIT" in variable else '{"m": 128000}'}).returncode == 0
    )
