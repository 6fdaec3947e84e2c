"""Summarizer backed by any OpenAI-compatible chat-completions endpoint (official `openai` SDK)."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from .base import SummarizerError, register
from .provider import ProviderSummarizer

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam


@register
class OpenAISummarizer(ProviderSummarizer):
    """Summarizes through `chat.completions.create` on OpenAI or any compatible server.

    `base_url` selects the endpoint (e.g. `http://localhost:11434/v1` for Ollama); None means
    api.openai.com. Retries and error mapping: see ProviderSummarizer.
    """

    name = "openai"
    sdk_module = "openai"
    client_class = "OpenAI"
    sdk_base_error = "OpenAIError"

    def _ask(self, sdk: ModuleType, *, system: str, user_turn: str, max_tokens: int) -> Any:
        chat: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user_turn},
        ]
        try:
            return self._client.chat.completions.create(
                model=self.model, messages=chat, max_tokens=max_tokens
            )
        except sdk.BadRequestError as exc:
            # Reasoning models (o-series, gpt-5) reject `max_tokens` and name the
            # replacement; every other compatible server only knows `max_tokens`.
            if "max_completion_tokens" not in str(exc):
                raise
            return self._client.chat.completions.create(
                model=self.model, messages=chat, max_completion_tokens=max_tokens
            )

    def _reply_text(self, reply: object) -> str:
        return _completion_text(reply)


def _completion_text(completion: object) -> str:
    from openai.types.chat import ChatCompletion

    # The SDK hands back plain text for a non-JSON content type and does not validate
    # fields by default, so every step is checked rather than trusted.
    if not isinstance(completion, ChatCompletion):
        raise SummarizerError("openai: malformed response: not a chat completion", permanent=True)
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise SummarizerError("openai: malformed response: no choices", permanent=True)
    choice = choices[0]
    if getattr(choice, "finish_reason", None) == "content_filter":
        raise SummarizerError("openai: summary blocked by the content filter", permanent=True)
    message = getattr(choice, "message", None)
    if getattr(message, "refusal", None):
        raise SummarizerError("openai: the model refused to summarize", permanent=True)
    content = getattr(message, "content", None)
    if not isinstance(content, str) or not content.strip():
        raise SummarizerError("openai: malformed response: empty content", permanent=True)
    return content.strip()
