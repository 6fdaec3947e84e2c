"""Summarizer backed by any OpenAI-compatible chat-completions endpoint (official `openai` SDK)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .base import Summarizer, SummarizerError, SummaryMessage, TokenCounter, register

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam

from .prompts import SYSTEM_PROMPT, render_messages
from .sdk_errors import sdk_error

# Local servers (Ollama, LM Studio, vLLM) ignore the key, but the SDK refuses to start without one.
_PLACEHOLDER_KEY = "not-needed"


@register
class OpenAISummarizer(Summarizer):
    """Summarizes through `chat.completions.create` on OpenAI or any compatible server.

    `base_url` selects the endpoint (e.g. `http://localhost:11434/v1` for Ollama); None means
    api.openai.com. The SDK's own retries are off by default because the Celery task retries
    transient failures (`SummarizerError(permanent=False)`): 429, 5xx, timeouts, connection
    errors. A rejected request (400/401/403/404) or an unusable answer is permanent. A provider
    error is always raised, never returned as summary text.
    """

    name = "openai"

    def __init__(
        self,
        *,
        count_tokens: TokenCounter,
        input_window_tokens: int = 100_000,
        api_key: str,
        base_url: str | None = None,
        model: str,
        timeout_seconds: float = 60.0,
        max_retries: int = 0,
    ) -> None:
        import openai  # lazily: the SDK is large and most deployments never call it

        super().__init__(count_tokens=count_tokens, input_window_tokens=input_window_tokens)
        if not api_key and not base_url:
            raise SummarizerError("openai: no API key configured", permanent=True)
        self.model = model
        self._api_key = api_key
        self._client = openai.OpenAI(
            api_key=api_key or _PLACEHOLDER_KEY,
            base_url=base_url,
            timeout=timeout_seconds,
            max_retries=max_retries,
        )

    def _summarize_piece(
        self, *, previous_summary: str, messages: Sequence[SummaryMessage], max_tokens: int
    ) -> str:
        import openai  # lazily: the SDK is large and most deployments never call it

        user_turn = render_messages(
            previous_summary=previous_summary, messages=messages, max_tokens=max_tokens
        )
        chat: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_turn},
        ]
        try:
            try:
                completion = self._client.chat.completions.create(
                    model=self.model, messages=chat, max_tokens=max_tokens
                )
            except openai.BadRequestError as exc:
                # Reasoning models (o-series, gpt-5) reject `max_tokens` and name the
                # replacement; every other compatible server only knows `max_tokens`.
                if "max_completion_tokens" not in str(exc):
                    raise
                completion = self._client.chat.completions.create(
                    model=self.model, messages=chat, max_completion_tokens=max_tokens
                )
        except (openai.OpenAIError, ValueError, TypeError) as exc:
            raise sdk_error(exc, sdk=openai, provider="openai", secret=self._api_key) from exc
        return _completion_text(completion)


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    return exc.message


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
