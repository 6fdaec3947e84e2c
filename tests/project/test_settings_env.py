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
