"""What fitting hands back (`Fitted`), shared by the ledger's ladder (fit.py) and the
per-thread fitting (thread_fit.py) without either importing the other's internals; `Wire` is
the wire contract (wire.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compaction_app.gateway.messages import GatewayError
from compaction_app.gateway.wire import Wire
from sessions_app.context_window import window_level
from sessions_app.services import model_registry

__all__ = ["Fitted", "Wire", "context_length_exceeded"]


@dataclass(frozen=True)
class Fitted:
    """What to forward to `model`. `body` None means the client's own bytes, unchanged."""

    model: str
    body: dict[str, Any] | None
    token_count: int
    limit: int
    compacted: bool
    compression: dict[str, Any] | None = None
    # The request's indices a per-call prune left out (the calls ledger shows which).
    pruned: tuple[int, ...] = ()

    @property
    def percent_used(self) -> float:
        # Thresholds play no part in the percentage: the window math is context_window's.
        return window_level(
            tokens=self.token_count, window=self.limit, compact_threshold=1, hard_threshold=1
        ).percent_used


def limit_phrase(*, limit: int, model: str) -> str:
    """`limit` said as what it is: the model's own window, or a smaller limit the session set
    ("2,000 tokens (the session's contextLimit; gpt-4o's own window is 128,000)")."""
    info = model_registry().lookup(model.strip())
    if info is not None and info.context_limit > limit:
        return (
            f"{limit:,} tokens (the session's contextLimit; {model}'s own window is "
            f"{info.context_limit:,})"
        )
    return f"{limit:,} tokens ({model}'s window)"


def context_length_exceeded(
    *, limit: int, needed: int, definitions: int, model: str
) -> GatewayError:
    """The provider-shaped refusal when what must be kept (`needed` tokens, tool definitions
    included) does not fit `limit` even after compaction."""
    return GatewayError(
        f"The context limit of this call is {limit_phrase(limit=limit, model=model)}; the "
        f"messages that must be kept need {needed:,} tokens even after compaction"
        + (f" (tool definitions included: {definitions:,})" if definitions else "")
        + ".",
        code="context_length_exceeded",
        param="messages",
        tokenCount=needed,
        limit=limit,
        model=model,
    )
