"""What fitting hands back (`Fitted`) and what it needs of a wire format (`Wire`): shared by
the ledger's ladder (fit.py) and the per-thread fitting (thread_fit.py), neither importing the
other's internals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Wire(Protocol):
    RENDER_FORMAT: str

    def with_context(
        self,
        body: dict[str, Any],
        *,
        messages: list[dict[str, Any]],
        system: str | None,
        model: str,
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Fitted:
    """What to forward to `model`. `body` None means the client's own bytes, unchanged."""

    model: str
    body: dict[str, Any] | None
    token_count: int
    limit: int
    compacted: bool
    compression: dict[str, Any] | None = None

    @property
    def percent_used(self) -> float:
        return round(100 * self.token_count / self.limit, 1) if self.limit else 0.0
