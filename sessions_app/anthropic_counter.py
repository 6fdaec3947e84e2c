"""Anthropic's Messages count-tokens endpoint as an exact counter for Claude models.

Pure module (no Django): the official `anthropic` SDK with its own retries off — the Celery task
that calls it owns retrying (`retry-after`, backoff), so a rate limit never blocks a worker in a
sleep loop. Errors come out as :class:`CountError`, transient (429, 5xx, timeout, connection)
or permanent (anything else, including a malformed answer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessions_app.event_types import EventType

__all__ = ["PAD_MESSAGE", "AnthropicCountClient", "CountError", "LedgerMessage", "is_claude"]

# The endpoint needs at least one message; the system prompt's own cost is measured as the
# difference it makes to this one-character user turn.
PAD_MESSAGE: dict[str, Any] = {"role": "user", "content": "."}

_ROLE: dict[str, str] = {
    EventType.USER_MESSAGE: "user",
    EventType.TOOL_RESULT: "user",
    EventType.CONTEXT_REFRESH: "user",
    EventType.COMPACTION: "user",
    EventType.AGENT_MESSAGE: "assistant",
    EventType.TOOL_CALL: "assistant",
}


def is_claude(model: str) -> bool:
    return "claude" in model.strip().lower().rsplit("/", 1)[-1]


class CountError(Exception):
    def __init__(self, message: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


@dataclass(frozen=True)
class LedgerMessage:
    """One model-visible ledger event, as the counter needs it."""

    type: str
    content: str
    name: str = ""
    tool_call_id: str = ""


def _block(message: LedgerMessage) -> dict[str, Any]:
    # Tool calls and results are sent as the text the ledger stores: a tool_use block would
    # need its tool_result in the same request, which a prefix ending at the call lacks.
    if message.type == EventType.TOOL_CALL:
        return {"type": "text", "text": f"[tool call {message.name}] {message.content}"}
    if message.type == EventType.TOOL_RESULT:
        return {"type": "text", "text": f"[tool result {message.name}] {message.content}"}
    return {"type": "text", "text": message.content or "."}


def to_anthropic_messages(messages: Sequence[LedgerMessage]) -> list[dict[str, Any]]:
    """Ledger events as Messages-API turns, consecutive same-role events merged into one turn."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = _ROLE.get(message.type, "user")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].append(_block(message))
        else:
            turns.append({"role": role, "content": [_block(message)]})
    return turns


def _retry_after(response: Any) -> float | None:
    if response is None:
        return None
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class AnthropicCountClient:
    """`count(model=..., system=..., messages=[...])` → input tokens of that request."""

    def __init__(self, *, api_key: str, base_url: str, timeout: float) -> None:
        import anthropic

        self._anthropic = anthropic
        self._client = anthropic.Anthropic(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0
        )

    def count(self, *, model: str, system: str | None, messages: list[dict[str, Any]]) -> int:
        anthropic = self._anthropic
        kwargs: dict[str, Any] = {"model": model, "messages": messages or [PAD_MESSAGE]}
        if system:
            kwargs["system"] = system
        try:
            result = self._client.messages.count_tokens(**kwargs)
        except anthropic.RateLimitError as exc:
            raise CountError(
                f"rate limited: {exc}", transient=True, retry_after=_retry_after(exc.response)
            ) from exc
        except anthropic.APIStatusError as exc:
            transient = exc.status_code >= 500 or exc.status_code == 408
            raise CountError(
                f"HTTP {exc.status_code}: {exc}",
                transient=transient,
                retry_after=_retry_after(exc.response),
            ) from exc
        except (anthropic.APITimeoutError, anthropic.APIConnectionError) as exc:
            raise CountError(f"unreachable: {exc}", transient=True) from exc
        except (anthropic.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
            raise CountError(f"malformed answer: {exc}", transient=False) from exc
        tokens = getattr(result, "input_tokens", None)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise CountError(f"malformed answer: input_tokens={tokens!r}", transient=False)
        return tokens
