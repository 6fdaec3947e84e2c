"""What the provider summarizers (OpenAI, Anthropic) share: a client of the provider's
official SDK built from the same settings, the prompt, and one mapping of the SDK's errors.
A subclass names its SDK and says how to ask for a summary and how to read the answer."""

from __future__ import annotations

import importlib
from abc import abstractmethod
from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar

from .base import Summarizer, SummarizerError, SummaryMessage, TokenCounter
from .prompts import SYSTEM_PROMPT, render_messages
from .sdk_errors import sdk_error

# Local servers and gateways may ignore the key, but the SDKs refuse to start without one.
_PLACEHOLDER_KEY = "not-needed"


class ProviderSummarizer(Summarizer):
    """Summarizes through a provider's official SDK.

    The SDK's own retries are off by default because the Celery task retries transient
    failures (`SummarizerError(permanent=False)`): 429, 5xx, timeouts, connection errors. A
    rejected request (400/401/403/404) or an unusable answer is permanent. A provider error is
    always raised, never returned as summary text.
    """

    # The SDK's module, its synchronous client class and the root of its exceptions.
    sdk_module: ClassVar[str]
    client_class: ClassVar[str]
    sdk_base_error: ClassVar[str]

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
        sdk = self._sdk()
        super().__init__(count_tokens=count_tokens, input_window_tokens=input_window_tokens)
        if not api_key and not base_url:
            raise SummarizerError(f"{self.name}: no API key configured", permanent=True)
        self.model = model
        self._api_key = api_key
        self._client = getattr(sdk, self.client_class)(
            api_key=api_key or _PLACEHOLDER_KEY,
            base_url=base_url,
            timeout=timeout_seconds,
            max_retries=max_retries,
        )

    def _sdk(self) -> ModuleType:
        # Imported lazily: the SDKs are large and most deployments never call them.
        return importlib.import_module(self.sdk_module)

    def _summarize_piece(
        self, *, previous_summary: str, messages: Sequence[SummaryMessage], max_tokens: int
    ) -> str:
        sdk = self._sdk()
        user_turn = render_messages(
            previous_summary=previous_summary, messages=messages, max_tokens=max_tokens
        )
        try:
            reply = self._ask(sdk, system=SYSTEM_PROMPT, user_turn=user_turn, max_tokens=max_tokens)
        except (getattr(sdk, self.sdk_base_error), ValueError, TypeError) as exc:
            raise sdk_error(exc, sdk=sdk, provider=self.name, secret=self._api_key) from exc
        return self._reply_text(reply)

    @abstractmethod
    def _ask(self, sdk: ModuleType, *, system: str, user_turn: str, max_tokens: int) -> Any:
        """Send one summary request through `self._client`; return the SDK's answer."""

    @abstractmethod
    def _reply_text(self, reply: object) -> str:
        """The summary in the answer; SummarizerError(permanent=True) when it is unusable."""
