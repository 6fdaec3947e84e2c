"""Builds a configured summarizer from settings (the only summarizer code that reads them)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from compaction_app.summarizers.base import Summarizer, TokenCounter, summarizer_class

# The settings prefix of each provider summarizer: <PREFIX>_API_KEY, _BASE_URL, _SUMMARY_MODEL.
_PROVIDER_PREFIX = {"openai": "OPENAI", "anthropic": "ANTHROPIC"}


def build_summarizer(name: str, *, count_tokens: TokenCounter) -> Summarizer:
    cls = summarizer_class(name)
    options: dict[str, Any] = {}
    prefix = _PROVIDER_PREFIX.get(name)
    if prefix:
        options = {
            "api_key": getattr(settings, f"{prefix}_API_KEY"),
            "base_url": getattr(settings, f"{prefix}_BASE_URL") or None,
            "model": getattr(settings, f"{prefix}_SUMMARY_MODEL"),
            "timeout_seconds": settings.SUMMARIZER_TIMEOUT_SECONDS,
        }
    return cls(
        count_tokens=count_tokens, input_window_tokens=settings.SUMMARIZER_WINDOW_TOKENS, **options
    )
