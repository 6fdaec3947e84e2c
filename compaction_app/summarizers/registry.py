"""Importing this module registers every built-in summarizer."""

from compaction_app.summarizers import anthropic_summarizer, local, openai_summarizer  # noqa: F401
from compaction_app.summarizers.base import summarizer_class, summarizer_names

__all__ = ["summarizer_class", "summarizer_names"]
