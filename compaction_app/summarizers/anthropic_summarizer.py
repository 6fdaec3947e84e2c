"""Summarizer backed by the Anthropic Messages API (official `anthropic` SDK)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .base import SummarizerError, register
from .provider import ProviderSummarizer


@register
class AnthropicSummarizer(ProviderSummarizer):
    """Summarizes through `messages.create` on the Anthropic API (or a compatible gateway).

    Transient failures include 529 overloaded; retries and error mapping: see
    ProviderSummarizer.
    """

    name = "anthropic"
    sdk_module = "anthropic"
    client_class = "Anthropic"
    sdk_base_error = "AnthropicError"

    def _ask(self, sdk: ModuleType, *, system: str, user_turn: str, max_tokens: int) -> Any:
        return self._client.messages.create(
            model=self.model,
            max_tokens=max_tokens,
            system=system,
            messages=[{"role": "user", "content": user_turn}],
        )

    def _reply_text(self, reply: object) -> str:
        return _message_text(reply)


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
