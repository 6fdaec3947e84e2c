"""Builds a configured summarizer from settings (the only summarizer code that reads them)."""

from __future__ import annotations

from django.conf import settings

from compaction_app.summarizers.base import Summarizer, TokenCounter, summarizer_class


def build_summarizer(name: str, *, count_tokens: TokenCounter) -> Summarizer:
    cls = summarizer_class(name)
    window = settings.SUMMARIZER_WINDOW_TOKENS
    if name == "openai":
        return cls(  # type: ignore[call-arg]
            count_tokens=count_tokens,
            input_window_tokens=window,
            api_key=settings.OPENAI_API_KEY,
            base_url=settings.OPENAI_BASE_URL or None,
            model=settings.OPENAI_SUMMARY_MODEL,
            timeout_seconds=settings.SUMMARIZER_TIMEOUT_SECONDS,
        )
    if name == "anthropic":
        return cls(  # type: ignore[call-arg]
            count_tokens=count_tokens,
            input_window_tokens=window,
            api_key=settings.ANTHROPIC_API_KEY,
            base_url=settings.ANTHROPIC_BASE_URL or None,
            model=settings.ANTHROPIC_SUMMARY_MODEL,
            timeout_seconds=settings.SUMMARIZER_TIMEOUT_SECONDS,
        )
    return cls(count_tokens=count_tokens, input_window_tokens=window)
