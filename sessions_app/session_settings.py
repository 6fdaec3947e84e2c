"""Per-session compaction settings: the typed settings with their defaults, and strict
validation of changes (pure, no ORM)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sessions_app.errors import InvalidInput

# Names of the strategies and summarizers compaction_app registers; a test in compaction_app
# keeps these in step with its registries (sessions_app must not import compaction_app).
STRATEGY_NAMES = ("trim", "summarize", "clear_tool_results")
SUMMARIZER_NAMES = ("local", "openai", "anthropic")


@dataclass(frozen=True)
class SessionSettings:
    """A session's compaction settings, typed, with the defaults (the one place they are
    written). Stored on the session as JSON under the camelCase names (`compactThreshold`);
    `of` reads that JSON, the default standing in for any setting it lacks."""

    auto_compact: bool = True
    compact_threshold: float = 0.80
    hard_limit_threshold: float = 0.95
    # Where a compaction in the call path (gateway, POST /context) compacts down to, as a share
    # of the window: crossing compact_threshold compacts once to here, then the prefix stays put.
    fit_target_ratio: float = 0.5
    cooldown_seconds: int = 60
    strategy: str = "summarize"
    summarizer: str = "local"
    # None: auto, the bound compaction_app/policy.py computes from the window.
    max_summary_tokens: int | None = None
    keep_recent_events: int = 2
    refresh_threshold_tokens: int = 800_000

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> SessionSettings:
        """The settings a session's stored JSON stands for (validated when it was stored)."""
        value = {name: stored.get(key, DEFAULTS[key]) for key, name in _FIELD_FOR_KEY.items()}
        budget = value["max_summary_tokens"]
        return cls(
            auto_compact=bool(value["auto_compact"]),
            compact_threshold=float(value["compact_threshold"]),
            hard_limit_threshold=float(value["hard_limit_threshold"]),
            fit_target_ratio=float(value["fit_target_ratio"]),
            cooldown_seconds=int(value["cooldown_seconds"]),
            strategy=str(value["strategy"]),
            summarizer=str(value["summarizer"]),
            max_summary_tokens=None if budget is None else int(budget),
            keep_recent_events=int(value["keep_recent_events"]),
            refresh_threshold_tokens=int(value["refresh_threshold_tokens"]),
        )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


# camelCase JSON name → field name, in declaration order.
_FIELD_FOR_KEY: dict[str, str] = {_camel(f.name): f.name for f in fields(SessionSettings)}

# The defaults as stored JSON (what a new session's `settings` holds before any change).
DEFAULTS: dict[str, Any] = {
    key: getattr(SessionSettings(), name) for key, name in _FIELD_FOR_KEY.items()
}


def _check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(
            "must be a boolean",
            code="invalid_settings",
            fields={f"settings.{key}": "must be a boolean"},
        )
    return value


def _check_ratio(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InvalidInput(
            "must be a number in (0, 1]",
            code="invalid_settings",
            fields={f"settings.{key}": "must be a number greater than 0 and at most 1"},
        )
    return float(value)


# Upper bounds keep every setting usable downstream (a timedelta, a token budget) and storable.
MAXIMUMS: dict[str, int] = {
    "cooldownSeconds": 10**9,
    "maxSummaryTokens": 100_000_000,
    "keepRecentEvents": 1_000_000,
    "refreshThresholdTokens": 10**15,
}


def _check_int(key: str, value: Any, minimum: int) -> int:
    maximum = MAXIMUMS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInput(
            f"must be an integer between {minimum} and {maximum}",
            code="invalid_settings",
            fields={f"settings.{key}": f"must be an integer between {minimum} and {maximum}"},
        )
    return value


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidInput(
            f"must be one of {', '.join(choices)}",
            code="invalid_settings",
            fields={f"settings.{key}": f"must be one of: {', '.join(choices)}"},
        )
    return str(value)


def validate_settings(changes: Any, *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Merge `changes` over `base` (or the defaults) and return the validated result."""
    if not isinstance(changes, Mapping):
        raise InvalidInput(
            "settings must be an object",
            code="invalid_settings",
            fields={"settings": "must be an object"},
        )
    unknown = sorted(set(changes) - set(DEFAULTS))
    if unknown:
        raise InvalidInput(
            f"unknown settings: {', '.join(unknown)}",
            code="invalid_settings",
            fields={f"settings.{key}": "unknown setting" for key in unknown},
        )
    merged = {**DEFAULTS, **(base or {}), **changes}
    result: dict[str, Any] = {
        "autoCompact": _check_bool("autoCompact", merged["autoCompact"]),
        "compactThreshold": _check_ratio("compactThreshold", merged["compactThreshold"]),
        "hardLimitThreshold": _check_ratio("hardLimitThreshold", merged["hardLimitThreshold"]),
        "fitTargetRatio": _check_ratio("fitTargetRatio", merged["fitTargetRatio"]),
        "cooldownSeconds": _check_int("cooldownSeconds", merged["cooldownSeconds"], 0),
        "strategy": _check_choice("strategy", merged["strategy"], STRATEGY_NAMES),
        "summarizer": _check_choice("summarizer", merged["summarizer"], SUMMARIZER_NAMES),
        "maxSummaryTokens": None
        if merged["maxSummaryTokens"] is None
        else _check_int("maxSummaryTokens", merged["maxSummaryTokens"], 16),
        "keepRecentEvents": _check_int("keepRecentEvents", merged["keepRecentEvents"], 0),
        "refreshThresholdTokens": _check_int(
            "refreshThresholdTokens", merged["refreshThresholdTokens"], 1
        ),
    }
    if result["compactThreshold"] > result["hardLimitThreshold"]:
        raise InvalidInput(
            "compactThreshold must not exceed hardLimitThreshold",
            code="invalid_settings",
            fields={"settings.compactThreshold": "must be <= hardLimitThreshold"},
        )
    return result
