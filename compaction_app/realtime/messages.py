"""Every realtime message, declared once: one typed model per `type`, with its fields.

Code that pushes to websockets builds one of these models (the builders below, or the
model's constructor) and hands it to `broadcast.broadcast`, which sends its JSON; the
dashboard reads a message back by its type (`parse`). Tests validate every message a run
sends against these models, and docs/api.md's message table is this module's `table()`
(tests/realtime/test_messages.py checks it).

To add a message type: declare a model here (`type: Literal["NAME"]`, camelCase fields, a
docstring saying when it is sent), add it to `Message`, build and send it where it happens,
and run `python -m compaction_app.realtime.messages` to print the docs table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

if TYPE_CHECKING:
    from compaction_app.models import CompactionRun
    from sessions_app.models import Session


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class CompactionPending(_Message):
    """An automatic compaction is about to be queued (pin what must stay); `percentUsed` is
    the main thread's, as `GET /usage` gives it."""

    type: Literal["COMPACTION_PENDING"] = "COMPACTION_PENDING"
    sessionId: str
    # The main thread's context figure (sessions_app.scope), as /usage gives it.
    percentUsed: float


class CompactionStart(_Message):
    """A worker started a run (of `thread`'s context; "": the whole ledger)."""

    type: Literal["COMPACTION_START"] = "COMPACTION_START"
    sessionId: str
    compactionId: str
    strategy: str
    trigger: str
    # The thread whose context the run compacts ("": the whole ledger).
    thread: str = ""
    message: str


class CompactionComplete(_Message):
    """A run ended: completed (`outcome` "compacted", or "nothing_to_fold" with its `reason`:
    said as such, not as a success) or failed; its tokens are `thread`'s context ("": the
    whole ledger's)."""

    type: Literal["COMPACTION_COMPLETE"] = "COMPACTION_COMPLETE"
    sessionId: str
    compactionId: str
    success: bool
    # The run's thread's context tokens before and after ("": the whole ledger's).
    thread: str = ""
    tokensBefore: int | None
    tokensAfter: int | None
    eventsBefore: int | None
    eventsAfter: int | None
    reductionPercent: float | None
    error: str | None
    keptPercent: float | None
    outcome: Literal["compacted", "nothing_to_fold", "failed"] | None
    reason: str | None = None
    message: str


class CompactionReverted(_Message):
    """A run was reverted: the context tokens just before and after."""

    type: Literal["COMPACTION_REVERTED"] = "COMPACTION_REVERTED"
    sessionId: str
    compactionId: str
    tokensBefore: int
    tokensAfter: int


class ContextCompressed(_Message):
    """A gateway call compacted: what it forwards is the fitted context."""

    type: Literal["CONTEXT_COMPRESSED"] = "CONTEXT_COMPRESSED"
    sessionId: str
    originalTokenCount: int
    compressedTokenCount: int


class Usage(BaseModel):
    """`USAGE_UPDATED.usage`: the `GET /sessions/{id}/usage` document (sessions_app.scope);
    the figures every client reads are required, others may be added."""

    model_config = ConfigDict(extra="allow", frozen=True)

    contextTokens: int
    contextLimit: int
    percentUsed: float
    nearLimit: bool
    atLimit: bool
    totalPromptTokens: int
    totalCompletionTokens: int
    totalTokens: int
    reportedEventCount: int
    calls: int
    failedCalls: int
    costUsd: float
    unpricedCalls: int
    costUnknownReason: str | None
    scope: dict[str, str]


class UsageUpdated(_Message):
    """The session's usage changed (an append request, a run, a revert); `usage` is `GET
    /usage`'s document: the main thread's context figures, the whole session's bill
    (`usage.scope` says so)."""

    type: Literal["USAGE_UPDATED"] = "USAGE_UPDATED"
    sessionId: str
    usage: Usage


class Pong(_Message):
    """The answer to a client's `{"type": "ping"}`."""

    type: Literal["pong"] = "pong"


Message = Annotated[
    CompactionPending
    | CompactionStart
    | CompactionComplete
    | CompactionReverted
    | ContextCompressed
    | UsageUpdated
    | Pong,
    Field(discriminator="type"),
]
MESSAGE_TYPES: tuple[type[_Message], ...] = (
    CompactionPending,
    CompactionStart,
    CompactionComplete,
    CompactionReverted,
    ContextCompressed,
    UsageUpdated,
    Pong,
)
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Message)


def parse(data: Any) -> _Message:
    """A received message as its model (pydantic's ValidationError when it is none of them)."""
    return _ADAPTER.validate_python(data)  # type: ignore[no-any-return]


# --- builders: each message is made here, from what it announces ---------------------------------


# (The models are imported by each builder: the declarations above need no Django.)


def compaction_pending(session: Session) -> CompactionPending:
    from sessions_app import scope

    return CompactionPending(
        sessionId=str(session.pk),
        percentUsed=scope.context_figures(session=session).percent_used,
    )


def compaction_start(run: CompactionRun) -> CompactionStart:
    return CompactionStart(
        sessionId=str(run.session_id),
        compactionId=str(run.pk),
        strategy=run.strategy,
        trigger=run.trigger,
        thread=run.thread,
        message="Compacting conversation to reduce size…",
    )


def compaction_complete(run: CompactionRun) -> CompactionComplete:
    from compaction_app.models import RunStatus
    from compaction_app.run_documents import completion_text, outcome

    success = run.status == RunStatus.COMPLETED
    result, reason = outcome(run)
    return CompactionComplete(
        sessionId=str(run.session_id),
        compactionId=str(run.pk),
        success=success,
        thread=run.thread,
        tokensBefore=run.tokens_before,
        tokensAfter=run.tokens_after,
        eventsBefore=run.events_before,
        eventsAfter=run.events_after,
        reductionPercent=run.reduction_percent,
        error=run.error or None,
        keptPercent=(run.loss_report or {}).get("keptPercent") if success else None,
        outcome=result,  # type: ignore[arg-type]
        reason=reason if success else None,
        message=completion_text(run) if success else f"Compaction failed: {run.error}",
    )


def compaction_reverted(
    *, session_id: Any, compaction_id: Any, tokens_before: int, tokens_after: int
) -> CompactionReverted:
    return CompactionReverted(
        sessionId=str(session_id),
        compactionId=str(compaction_id),
        tokensBefore=tokens_before,
        tokensAfter=tokens_after,
    )


def context_compressed(
    *, session_id: Any, original_tokens: int, compressed_tokens: int
) -> ContextCompressed:
    return ContextCompressed(
        sessionId=str(session_id),
        originalTokenCount=original_tokens,
        compressedTokenCount=compressed_tokens,
    )


def usage_updated(session: Session) -> UsageUpdated:
    """REST /usage's document, exactly (sessions_app.selectors.usage_for_session)."""
    from sessions_app.selectors import usage_for_session

    return UsageUpdated(
        sessionId=str(session.pk), usage=Usage(**usage_for_session(session=session))
    )


def type_name(model: type[_Message]) -> str:
    return str(model.model_fields["type"].default)


def table() -> str:
    """docs/api.md's message table: each type, its fields, when it is sent."""
    lines = ["| message | fields | sent when |", "|---|---|---|"]
    for model in MESSAGE_TYPES:
        fields = ", ".join(f"`{name}`" for name in model.model_fields if name != "type") or "—"
        doc = " ".join((model.__doc__ or "").split())
        lines.append(f"| `{type_name(model)}` | {fields} | {doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
