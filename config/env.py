"""Strict helpers for reading settings from environment variables.

Every variable the project reads goes through one of these, so a typo in a value fails at
start-up with a clear message instead of silently falling back to a default. The table of
variables in docs/operations.md is checked against the names used here by
tests/test_settings_env.py.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str = "") -> str:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {value!r}")


# Plain ASCII decimals: int() and float() would also take other scripts' digits (fullwidth
# `１２８`), underscores (`1_000`) and, for floats, `inf` and `nan`.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    value = _raw(name)
    if value is None:
        return default
    if not _INTEGER.fullmatch(value):
        raise ImproperlyConfigured(
            f"{name} must be a whole number in ASCII digits, got {value[:40]!r}"
        )
    number = int(value)
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name} must be <= {maximum}, got {value[:40]}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    number = float(value) if _DECIMAL.fullmatch(value) else math.nan
    if not math.isfinite(number):
        raise ImproperlyConfigured(f"{name} must be a number, got {value[:40]!r}")
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {number}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_json(name: str, default: Any) -> Any:
    value = _raw(name)
    if value is None:
        return default
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} must be JSON: {exc}") from None


def context_windows(name: str, value: Any, *, maximum: int) -> dict[str, int]:
    """`value` (read from `name`) as {model: window}, each window a whole number of tokens
    from 1 to `maximum` (what the API accepts): refused at start-up otherwise, rather than on
    the first call that looks a model up."""
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f'{name} must be a JSON object {{"model": tokens}}')
    for model, window in value.items():
        if isinstance(window, bool) or not isinstance(window, int) or not 0 < window <= maximum:
            raise ImproperlyConfigured(
                f"{name}: the window of {model[:80]!r} must be a whole number of tokens "
                f"from 1 to {maximum}, got {str(window)[:40]}"
            )
    return value
