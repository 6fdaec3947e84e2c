"""Wire-format-neutral pieces of the gateway: a client message, the events it becomes, its
stable hash and the idempotent ids derived from it. Pure: no Django, no ORM.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sessions_app.event_types import EventType
from sessions_app.usage_bounds import NAMES as USAGE_NAMES
from sessions_app.usage_bounds import bound_parts, bound_usage

# Short names for the event types a client message becomes (sessions_app.event_types is pure
# too, so this module imports without Django).
SYSTEM_PROMPT = EventType.SYSTEM_PROMPT
USER_MESSAGE = EventType.USER_MESSAGE
AGENT_MESSAGE = EventType.AGENT_MESSAGE
TOOL_CALL = EventType.TOOL_CALL
TOOL_RESULT = EventType.TOOL_RESULT

# Event ids derived from (session, chain hash, part), where a message's chain hash covers it
# and every message before it: a retried or concurrently repeated request maps to the ids
# already stored (the append service returns them as they are instead of storing them again),
# while the same text after another history (a parallel worker, a side call, a reply to
# another question) is an event of its own.
_ID_NAMESPACE = uuid.UUID("6f1c3c0e-4b52-4d1e-9a57-2f0f6d3c9b10")


class GatewayInputError(ValueError):
    """The request body is not what the wire format allows (a 400 in the provider's shape)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class GatewayError(Exception):
    """A request the gateway answers itself, in the provider's error shape."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param
        self.extra = extra
        # Response headers the answer carries (a refusal's Retry-After).
        self.headers = headers or {}
        # The model the refused body named, when it could be read (the call's row says it).
        self.named_model = ""


@dataclass(frozen=True)
class EventDraft:
    """One ledger event a client message (or a reply) becomes."""

    type: str
    content: Any
    name: str = ""
    tool_call_id: str = ""


@dataclass(frozen=True)
class ClientMessage:
    """A message as the client sent it: its role, what identifies it (text and tool ids) and
    the events it is recorded as."""

    role: str
    hash_text: str
    tool_ids: tuple[str, ...]
    drafts: tuple[EventDraft, ...]

    @property
    def hash(self) -> str:
        return message_hash(self.role, self.hash_text, self.tool_ids)


@dataclass(frozen=True)
class Reply:
    """The provider's answer, in neutral form."""

    message: ClientMessage
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    raw_usage: dict[str, Any] = field(default_factory=dict)
    # Parts of prompt_tokens the provider reported as cache reads and cache writes (of which
    # at the one-hour rate); None when it said nothing (see gateway/usage.py).
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    # Part of completion_tokens spent reasoning (None: not reported).
    reasoning_tokens: int | None = None
    # Parts of the figures above the provider sampled as requests of their own and bills
    # apart (Anthropic's compaction iterations), in the same neutral figures.
    priced_apart: tuple[dict[str, int | None], ...] = ()
    # Figures the provider reported that the ledger does not record, by API name, with why:
    # unreadable ones (noted by the wire's usage reader) and those past the one bound
    # (sessions_app/usage_bounds.py), applied here, once, for the reply's events and its call's
    # row alike (issue 42, row 4). The parts priced apart are bounded by the same rule and
    # must fit in the bounded whole: else they are dropped (the call is priced as one request).
    usage_dropped: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kept, dropped = bound_usage({name: getattr(self, name) for name in USAGE_NAMES})
        parts, parts_dropped = bound_parts(kept, self.priced_apart)
        dropped.update(parts_dropped)
        if dropped:
            for name, value in kept.items():
                object.__setattr__(self, name, value)
            object.__setattr__(self, "usage_dropped", {**self.usage_dropped, **dropped})
        if parts != self.priced_apart:
            object.__setattr__(self, "priced_apart", parts)


def message_hash(role: str, text: str, tool_ids: Sequence[str]) -> str:
    """A stable 128-bit hash of a message's role, content and tool ids."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(role.encode())
    digest.update(b"\x00")
    digest.update(text.encode("utf-8", "surrogatepass"))
    digest.update(b"\x00")
    digest.update("\x1f".join(tool_ids).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def chain_hash(previous: str, msg_hash: str) -> str:
    """The hash of a conversation up to and including a message: its predecessor's chain hash
    ("" for the first message) combined with the message's own hash."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(previous.encode())
    digest.update(b"\x00")
    digest.update(msg_hash.encode())
    return digest.hexdigest()


def chain_hashes(hashes: Sequence[str], previous: str = "") -> list[str]:
    chained: list[str] = []
    for digest in hashes:
        previous = chain_hash(previous, digest)
        chained.append(previous)
    return chained


def event_id(session_id: uuid.UUID | str, chain: str, part: int) -> uuid.UUID:
    """The id of part `part` of the message whose chain hash is `chain`."""
    return uuid.uuid5(_ID_NAMESPACE, f"{session_id}:{chain}:{part}")


def canonical_json(value: Any) -> str:
    """JSON that does not depend on key order or on how an SDK spells absent fields."""
    return json.dumps(_drop_none(value), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def require_str(value: Any, param: str, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise GatewayInputError(
            f"{param} must be a {'non-empty ' if not allow_empty else ''}string", param=param
        )
    return value


def text_and_json(parts: list[Any], param: str, *, text_type: str = "text") -> tuple[str, Any]:
    """Content given as a list of parts: the text parts joined (counted exactly) when every
    part is text, else the parts themselves (counted by the non-text rule). Returns the text
    that identifies the message and the content to store."""
    texts: list[str] = []
    only_text = True
    for index, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise GatewayInputError(
                "each content part must be an object with a type", param=f"{param}[{index}]"
            )
        if part["type"] == text_type:
            texts.append(require_str(part.get("text"), f"{param}[{index}].text"))
        else:
            only_text = False
    if only_text:
        text = "\n".join(texts)
        return text, text
    return canonical_json(parts), parts
