"""What fitting hands back (`Fitted`), shared by the ledger's ladder (fit.py) and the
per-thread fitting (thread_fit.py) without either importing the other's internals; `Wire` is
the wire contract (wire.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compaction_app.gateway.messages import GatewayError
from compaction_app.gateway.wire import Wire
from sessions_app.context_window import window_level

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


def context_length_exceeded(
    *, limit: int, needed: int, definitions: int, model: str
) -> GatewayError:
    """The provider-shaped refusal when what must be kept (`needed` tokens, tool definitions
    included) does not fit `limit` even after compaction."""
    return GatewayError(
        f"This model's maximum context length is {limit} tokens; the messages that must "
        f"be kept need {needed} tokens even after compaction"
        + (f" (tool definitions included: {definitions})" if definitions else "")
        + ".",
        code="context_length_exceeded",
        param="messages",
        tokenCount=needed,
        limit=limit,
        model=model,
    )
