"""Summarizer backed by the Anthropic Messages API (official `anthropic` SDK)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .base import Summarizer, SummarizerError, SummaryMessage, TokenCounter, register

if TYPE_CHECKING:
    import anthropic

from .prompts import SYSTEM_PROMPT, render_messages
from .sdk_errors import sdk_error

# A gateway in front of Anthropic may authenticate on its own, but the SDK wants some key.
_PLACEHOLDER_KEY = "not-needed"


@register
class AnthropicSummarizer(Summarizer):
    """Summarizes through `messages.create` on the Anthropic API (or a compatible gateway).

    The SDK's own retries are off by default because the Celery task retries transient
    failures (`SummarizerError(permanent=False)`): 429, 5xx including 529 overloaded,
    timeouts, connection errors. A rejected request (400/401/403/404) or an unusable answer
    is permanent. A provider error is always raised, never returned as summary text.
    """

    name = "anthropic"

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
        import anthropic  # lazily: the SDK is large and most deployments never call it

        super().__init__(count_tokens=count_tokens, input_window_tokens=input_window_tokens)
        if not api_key and not base_url:
            raise SummarizerError("anthropic: no API key configured", permanent=True)
        self.model = model
        self._api_key = api_key
        self._client = anthropic.Anthropic(
            api_key=api_key or _PLACEHOLDER_KEY,
            base_url=base_url,
            timeout=timeout_seconds,
            max_retries=max_retries,
        )

    def _summarize_piece(
        self, *, previous_summary: str, messages: Sequence[SummaryMessage], max_tokens: int
    ) -> str:
        import anthropic  # lazily: the SDK is large and most deployments never call it

        user_turn = render_messages(
            previous_summary=previous_summary, messages=messages, max_tokens=max_tokens
        )
        try:
            message = self._client.messages.create(
                model=self.model,
                max_tokens=max_tokens,
                system=SYSTEM_PROMPT,
                messages=[{"role": "user", "content": user_turn}],
            )
        except (anthropic.AnthropicError, ValueError, TypeError) as exc:
            raise sdk_error(exc, sdk=anthropic, provider="anthropic", secret=self._api_key) from exc
        return _message_text(message)


def _error_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    return exc.message


def _message_text(message: object) -> str:
    from anthropic.types import Message

    # The SDK hands back plain text for a non-JSON content type and does not validate
    # fields by default, so every step is checked rather than trusted.
    if not isinstance(message, Message):
        raise SummarizerError("anthropic: malformed response: not a message", permanent=True)
    if getattr(message, "stop_reason", None) == "refusal":
        raise SummarizerError("anthropic: the model refused to summarize", permanent=True)
    blocks = getattr(message, "content", None)
    if not isinstance(blocks, list):
        raise SummarizerError("anthropic: malformed response: no content", permanent=True)
    texts = [
        block.text
        for block in blocks
        if getattr(block, "type", None) == "text" and isinstance(getattr(block, "text", None), str)
    ]
    text = "".join(texts).strip()
    if not text:
        raise SummarizerError("anthropic: malformed response: no text content", permanent=True)
    return text
